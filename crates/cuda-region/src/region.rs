//! The region file: create or attach, map, lock. Thin shell over [`crate::accounting`].

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

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
    /// Task priority written to the region (`CUDA_TASK_PRIORITY`).
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
/// Why the region could not be used.
pub enum RegionError {
    /// A system call on the file failed.
    Io {
        /// The operation that failed.
        what: &'static str,
        /// The region file.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// The file exists with another size: another layout (v0, pre-v0) or something else.
    WrongSize {
        /// The region file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
    },
    /// The file carries another magic or version.
    Foreign {
        /// The region file.
        path: PathBuf,
        /// Its `initialized_flag`.
        magic: i32,
        /// Its major version.
        major: u32,
        /// Its minor version.
        minor: u32,
    },
    /// No process slot could be claimed.
    Slots(SlotError),
    /// The path is not a regular file this hook can trust (the directory is writable by the
    /// tenant): a symbolic link, FIFO, directory, device, socket or hard-linked file.
    Unsafe {
        /// The region file.
        path: PathBuf,
        /// What it is instead.
        what: String,
    },
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
            RegionError::Unsafe { path, what } => write!(
                f,
                "{} {what}: the shared region must be a plain regular file (it is never followed, created through a link, resized or re-moded when this hook did not create it); remove it with no GPU process running, or set CUDA_DEVICE_MEMORY_SHARED_CACHE to a path only the container's GPU processes write",
                path.display()
            ),
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
    /// This process's region lock word (`lock_word(slot, generation)`).
    word: u64,
    /// Serialises this process's writers of its own slot (the seqlock has one writer).
    writers: Mutex<()>,
    /// Per device, the highest memory limit (bytes) and SM limit (percent) this process
    /// accepts, 0 = no cap ([`Region::cap_limits`]): the region is writable by every process
    /// of the container.
    ceiling: [u64; MAX_DEVICES],
    sm_ceiling: [u64; MAX_DEVICES],
}

/// Holds the region lock word; released on drop.
struct RegionLock<'a> {
    word: &'a AtomicU64,
    mine: u64,
}

impl Drop for RegionLock<'_> {
    fn drop(&mut self) {
        // Only the holder stores 0; a taker-over would have replaced our word first.
        let _ = self.word.compare_exchange(self.mine, 0, Release, Relaxed);
    }
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

/// For the device plugin: creates the container's region file at `path` (on the host, in the
/// container's accounting directory) — full size, zeroed (the first process initialises it),
/// mode 0666 — and returns its inode for the container's config (`shared-cache-inode`).
/// `anchor` (a path in a directory the plugin alone writes, on the same file system) gets a
/// second hard link to it, so the inode stays allocated when the tenant deletes the
/// container's name: a file created in its place can never reuse the inode number. An
/// existing plain file of a region's size (a repeated Allocate) is kept. One no hook could
/// map — cut short (an interrupted earlier try: created, not yet sized), a link or a FIFO —
/// is replaced, unless a live process holds a lock on it (then it is an error naming why);
/// a directory is an error.
pub fn prepare_file(path: &Path, anchor: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let create = || -> io::Result<u64> {
        let file = hami_kernel_locks::private_file::create_new(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o666))?;
        file.set_len(FILE_SIZE as u64)?;
        Ok(file.metadata()?.ino())
    };
    // The shared rule (kernel-locks' region_file): keep a region, replace what no hook could
    // map unless a live process has it attached, refuse a directory.
    let inode = hami_kernel_locks::region_file::prepare(path, FILE_SIZE as u64, create)?;
    match std::fs::symlink_metadata(anchor) {
        Ok(meta) if meta.ino() == inode => {}
        Ok(_) => {
            std::fs::remove_file(anchor)?;
            std::fs::hard_link(path, anchor)?;
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => std::fs::hard_link(path, anchor)?,
        Err(err) => return Err(err),
    }
    Ok(inode)
}

/// Opens the region file without following a symbolic link, creating it (exclusively, so a
/// dangling link's target is never created) when absent. Returns whether this call created it.
fn open_region_file(path: &Path) -> Result<(File, bool), RegionError> {
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let refuse = |what: &str| RegionError::Unsafe {
        path: path.to_path_buf(),
        what: what.to_owned(),
    };
    let open_err = |source| RegionError::Io {
        what: "open",
        path: path.to_path_buf(),
        source,
    };
    for _ in 0..4 {
        match File::options()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
        {
            Ok(file) => return Ok((file, false)),
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
            Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
                return Err(refuse("is a symbolic link"));
            }
            Err(err) if err.raw_os_error() == Some(libc::EISDIR) => {
                return Err(refuse("is a directory"));
            }
            Err(err) if err.raw_os_error() == Some(libc::ENXIO) => {
                return Err(refuse("is a FIFO or socket"));
            }
            Err(err) => return Err(open_err(err)),
        }
        match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(flags)
            .open(path)
        {
            Ok(file) => return Ok((file, true)),
            // Another process created it first, or a link appeared: look again.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(open_err(err)),
        }
    }
    Err(open_err(io::Error::other(
        "it keeps appearing and disappearing",
    )))
}

/// The size of a region file someone else created: an empty one may be a creator's between
/// its create and its resize, so it is given up to two seconds to grow (never grown here).
fn settled_size(file: &File) -> io::Result<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let size = file.metadata()?.len();
        if size != 0 || std::time::Instant::now() >= deadline {
            return Ok(size);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

impl Region {
    /// Opens `path` (creating it with `init` when new) and claims a slot for this process.
    /// The directory may belong to the tenant, so the path is opened without following a
    /// link, must be a regular file with one link, and is sized and made mode 0666 only when
    /// this call created it; anything else of the wrong size or magic is refused untouched.
    pub fn attach(path: &Path, init: &InitValues) -> Result<Region, RegionError> {
        Self::attach_expecting(path, init, None)
    }

    /// As [`Region::attach`]; with `inode`, only the file the device plugin created
    /// ([`prepare_file`], whose inode it put in the container's config) is used: a missing
    /// file is never created and a replaced one is refused, so deleting the region (the
    /// directory is the container's) fails closed instead of starting a second, empty
    /// accounting beside the first.
    pub fn attach_expecting(
        path: &Path,
        init: &InitValues,
        inode: Option<u64>,
    ) -> Result<Region, RegionError> {
        use std::os::unix::fs::MetadataExt;
        let io_err = |what: &'static str| {
            let path = path.to_path_buf();
            move |source| RegionError::Io { what, path, source }
        };
        let unsafe_file = |what: String| RegionError::Unsafe {
            path: path.to_path_buf(),
            what,
        };
        let (file, created) = match inode {
            None => open_region_file(path)?,
            Some(expected) => {
                let file = match File::options()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
                    .open(path)
                {
                    Ok(file) => file,
                    Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                        return Err(unsafe_file(
                            "is missing (the device plugin created it for this container, so it was deleted); restart the container".to_owned(),
                        ));
                    }
                    Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
                        return Err(unsafe_file("is a symbolic link".to_owned()));
                    }
                    Err(err) => return Err(io_err("open")(err)),
                };
                let found = file.metadata().map_err(io_err("stat"))?.ino();
                if found != expected {
                    return Err(unsafe_file(format!(
                        "was replaced (inode {found}; the device plugin created inode {expected}); restart the container"
                    )));
                }
                (file, false)
            }
        };
        let meta = file.metadata().map_err(io_err("stat"))?;
        let kind = meta.file_type();
        if !kind.is_file() {
            use std::os::unix::fs::FileTypeExt;
            let what = if kind.is_fifo() {
                "is a FIFO"
            } else if kind.is_dir() {
                "is a directory"
            } else if kind.is_socket() {
                "is a socket"
            } else if kind.is_block_device() || kind.is_char_device() {
                "is a device node"
            } else {
                "is not a regular file"
            };
            return Err(unsafe_file(what.to_owned()));
        }
        // With an expected inode the plugin keeps a second link (`prepare_file`'s anchor);
        // the inode check already excludes every other file.
        if inode.is_none() && meta.nlink() != 1 {
            return Err(unsafe_file(format!(
                "has {} hard links (another name for some other file)",
                meta.nlink()
            )));
        }
        if created {
            // Ours: 0666 without touching the process umask (the reference sets umask(0)).
            file.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(io_err("set the mode of"))?;
            file.set_len(FILE_SIZE as u64).map_err(io_err("size"))?;
        } else {
            let size = settled_size(&file).map_err(io_err("stat"))?;
            if size != FILE_SIZE as u64 && size != REGION_SIZE as u64 {
                return Err(RegionError::WrongSize {
                    path: path.to_path_buf(),
                    size,
                });
            }
        }
        // Held until the slot is claimed; closing the file on an error path drops it too.
        flock(&file, libc::LOCK_EX).map_err(io_err("lock"))?;
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
            word: 0,
            writers: Mutex::new(()),
            ceiling: [0; MAX_DEVICES],
            sm_ceiling: [0; MAX_DEVICES],
        };
        let result = region.init_and_claim(init);
        let _ = flock(&region.file, libc::LOCK_UN);
        result.map(|slot| {
            region.slot = slot;
            let generation = region.shared().procs[slot].generation.load(Relaxed);
            region.word = crate::layout::lock_word(slot, generation);
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

    /// The mapped region.
    pub fn shared(&self) -> &SharedRegion {
        // SAFETY: the mapping is REGION_SIZE bytes, page-aligned, alive until Drop; every
        // field is valid for any bit pattern and only accessed through atomics.
        unsafe { &*self.map }
    }

    /// The region file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This process's slot.
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

    /// Caps this process's limits at `init`'s (the device plugin's read-only config): the
    /// memory and SM limits in force are then the lower of the region's stored ones and
    /// these, so a process that writes the region (every process of the container can) may
    /// lower a limit but cannot raise it past the config's (issue 26 item 3).
    pub fn cap_limits(&mut self, init: &InitValues) {
        self.ceiling = init.limits;
        self.sm_ceiling = init.sm_limits;
    }

    /// Limits stored in the region that differ from `init`: `(device, stored, wanted)`.
    pub fn limit_mismatches(&self, init: &InitValues) -> Vec<(usize, u64, u64)> {
        (0..MAX_DEVICES)
            .filter_map(|d| {
                let stored = self.shared().limit[d].load(Relaxed);
                (stored != init.limits[d]).then_some((d, stored, init.limits[d]))
            })
            .collect()
    }

    /// The memory limit in force on `device` in bytes (0: none, or no such device): the
    /// stored one, capped by [`Region::cap_limits`].
    pub fn limit(&self, device: usize) -> u64 {
        let stored = self
            .shared()
            .limit
            .get(device)
            .map_or(0, |l| l.load(Relaxed));
        accounting::limit_in_force(stored, self.ceiling.get(device).copied().unwrap_or(0))
    }

    /// The SM limit in force on `device` in percent (100 when out of range): the stored
    /// one, capped by [`Region::cap_limits`].
    pub fn sm_limit(&self, device: usize) -> u64 {
        let Some(stored) = self.shared().sm_limit.get(device) else {
            return 100;
        };
        accounting::limit_in_force(stored.load(Relaxed), self.sm_ceiling[device])
    }

    /// Bytes all processes use on `device`.
    pub fn device_usage(&self, device: usize) -> u64 {
        accounting::device_usage(self.shared(), device)
    }

    /// Takes the region lock word (`owner_pid`): one CAS when free. A waiter spins, then
    /// yields, then sleeps; every 64 attempts it checks whether the holder is gone (dead, or
    /// its slot reclaimed) and takes the word over, so a holder killed at any instant never
    /// blocks anyone. The holder's half-done work needs no repair: usage is always the sum
    /// of the slots, and a dead slot's bytes are reclaimed whole.
    fn lock_region(&self) -> RegionLock<'_> {
        let word = &self.shared().owner_pid;
        // Callers hold `writers`, so no other thread of this process holds the word while
        // this one waits: a word naming our own slot is never ours (issue 26 item 12).
        let waiter = crate::takeover::Waiter {
            own_word: self.word,
            threads_may_hold: false,
        };
        let mut attempts: u32 = 0;
        loop {
            match word.compare_exchange_weak(0, self.word, Acquire, Relaxed) {
                Ok(_) => break,
                Err(held) => {
                    attempts = attempts.wrapping_add(1);
                    if held != 0
                        && attempts.is_multiple_of(64)
                        && accounting::holder_gone(self.shared(), held, waiter, &|i| {
                            self.slot_alive(i)
                        })
                        && word
                            .compare_exchange(held, self.word, Acquire, Relaxed)
                            .is_ok()
                    {
                        break;
                    }
                    hami_kernel_locks::lock_backoff::wait(attempts, 64);
                }
            }
        }
        RegionLock {
            word,
            mine: self.word,
        }
    }

    /// Reserves `bytes` on `device` for this process: the check and the add run under the
    /// region lock word, so concurrent reservations of all processes are serialised without
    /// a system call. Over the limit, dead processes are reclaimed once (under the file lock,
    /// a system call only on this refusal path) and the check runs again.
    pub fn reserve(&self, device: usize, bytes: u64) -> Result<(), Refusal> {
        let _writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        let ceiling = self.ceiling.get(device).copied().unwrap_or(0);
        let first = {
            let _lock = self.lock_region();
            accounting::reserve(self.shared(), self.slot, device, bytes, ceiling)
        };
        if first.is_err() && self.reclaim_dead() > 0 {
            let _lock = self.lock_region();
            return accounting::reserve(self.shared(), self.slot, device, bytes, ceiling);
        }
        first
    }

    /// Returns `bytes` of `device`. Usage only goes down, so no region lock is needed, only
    /// exclusion of this process's other writers of its slot.
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

    /// Writes this process's host pid into its slot.
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
