//! A process's attachment to the region: the mapping, its claimed slot, and the accounting
//! operations. All shared state is touched through atomics of [`RegionLayout`].

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::accounting::{self, OverLimit};
use crate::layout::{
    DeviceAccount, LIMIT_NONE, MAGIC, MAJOR_VERSION, MAX_DEVICES, MAX_PROCS, MINOR_VERSION,
    ProcSlot, REGION_SIZE, RegionLayout, SLOT_ACTIVE, SLOT_FREE, SLOT_SIZE, lock_holder, lock_word,
    slot_offset,
};
use hami_kernel_locks::file_lock::{
    any_record_locked_elsewhere, flock_exclusive, flock_unlock, record_locked_elsewhere,
    try_lock_record,
};

/// Per-device limits a creator writes into a new region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes per device; [`LIMIT_NONE`] where no limit is configured.
    pub bytes: [u64; MAX_DEVICES],
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            bytes: [LIMIT_NONE; MAX_DEVICES],
        }
    }
}

impl Limits {
    fn configured_devices(&self) -> u32 {
        self.bytes.iter().filter(|b| **b != LIMIT_NONE).count() as u32
    }
}

/// Why the region could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The file cannot be opened or created.
    #[error(
        "cannot open the shared accounting file {path}: {source}; make sure its directory exists and is writable, or set HIP_DEVICE_MEMORY_SHARED_CACHE to a writable path"
    )]
    Open {
        /// The region file.
        path: PathBuf,
        /// What `open(2)` said.
        source: io::Error,
    },
    /// A system call on the file failed.
    #[error("cannot {what} the shared accounting file {path}: {source}")]
    Io {
        /// The operation that failed.
        what: &'static str,
        /// The region file.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// The file holds another layout version (or is not a region).
    #[error(
        "{path} is not a version {MAJOR_VERSION}.x HIP accounting region ({found}); delete it once no process uses it, or set HIP_DEVICE_MEMORY_SHARED_CACHE to another path"
    )]
    Incompatible {
        /// The region file.
        path: PathBuf,
        /// What its header holds instead.
        found: String,
    },
    /// Every process slot is held by a live process.
    #[error(
        "all {MAX_PROCS} process slots of {path} are held by live processes: no more processes can use the GPU in this container"
    )]
    Full {
        /// The region file.
        path: PathBuf,
    },
    /// The path is not a plain file this process may use: the directory is writable by the
    /// container, so a symbolic link, FIFO, directory or hard link there may be planted.
    #[error(
        "refusing the shared accounting file {path}: {reason}; it must be a regular file with one link that this hook created; remove it, or set HIP_DEVICE_MEMORY_SHARED_CACHE to another path"
    )]
    Unsafe {
        /// The region file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// The reservation would pass the device's limit.
    #[error(
        "device {device}: {} bytes requested, {} of {} bytes in use", .over.requested, .over.used, .over.limit
    )]
    OverLimit {
        /// The device index.
        device: usize,
        /// The figures that refused it.
        over: OverLimit,
    },
    /// The device index is outside the region.
    #[error("device index {0} is outside the region's {MAX_DEVICES} devices")]
    NoSuchDevice(usize),
}

/// Usage of one device as the region sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceUsage {
    /// Bytes reserved by all processes.
    pub used: u64,
    /// Limit in force in bytes (the stored one, capped by [`Session::cap_limits`]),
    /// [`LIMIT_NONE`](crate::layout::LIMIT_NONE) if none.
    pub limit: u64,
    /// Highest `used` seen since creation.
    pub peak: u64,
}

/// What a reclaim pass found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Slots of dead processes freed.
    pub slots: usize,
    /// Bytes those processes held, now returned to their devices.
    pub bytes: u64,
}

/// One slot as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    /// The slot's index in the region.
    pub index: usize,
    /// PID in the container's PID namespace.
    pub pid: i32,
    /// PID in the host namespace, 0 while unknown.
    pub hostpid: i32,
    /// Whether its owner lives (holds the slot's record lock; a failed probe counts as alive).
    pub alive: bool,
    /// `(device, bytes)` for devices where the slot holds bytes.
    pub used: Vec<(usize, u64)>,
}

/// A process's claimed slot in a mapped region. Dropping it returns the slot's bytes and
/// frees the slot; [`Session::abandon`] leaves both behind, as a SIGKILL does.
pub struct Session {
    map: NonNull<RegionLayout>,
    path: PathBuf,
    /// Holds the slot's record lock for the session's life.
    owner: File,
    /// A second open file description, holding nothing: liveness probes through it see
    /// every holder (including this session) and its `flock` serialises reclaims.
    probe: File,
    /// Threads of this process share `probe`'s `flock`, so they also need this.
    reclaim_mutex: Mutex<()>,
    slot: usize,
    word: u64,
    /// Per device, the highest limit this process accepts ([`Session::cap_limits`]); the
    /// region's stored limit is writable by every process of the container.
    ceiling: [u64; MAX_DEVICES],
}

// SAFETY: the mapping is only accessed through atomics; the files are plain fds.
unsafe impl Send for Session {}
// SAFETY: as above; every method takes `&self` and synchronises through atomics and locks.
unsafe impl Sync for Session {}

/// Holds a device's accounting lock; released on drop.
pub struct DeviceLock<'a> {
    account: &'a DeviceAccount,
    word: u64,
}

impl Drop for DeviceLock<'_> {
    fn drop(&mut self) {
        // Only the holder stores 0; a stealer would have replaced our word first.
        let _ = self
            .account
            .lock
            .compare_exchange(self.word, 0, Release, Relaxed);
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RegionError + 'a {
    move |source| RegionError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

fn unsafe_file(path: &Path, reason: impl Into<String>) -> RegionError {
    RegionError::Unsafe {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Opens an existing region file without following a symbolic link, and checks that it is
/// a regular file with one link; `Ok(None)` when there is none.
fn open_existing(path: &Path) -> Result<Option<File>, RegionError> {
    let opened = File::options()
        .read(true)
        .write(true)
        // O_NONBLOCK: opening a planted FIFO must not wait for a writer.
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(unsafe_file(path, "it is a symbolic link"));
        }
        Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {
            return Err(unsafe_file(path, "it is a directory"));
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(unsafe_file(path, "it is a socket or device"));
        }
        Err(source) => {
            return Err(RegionError::Open {
                path: path.to_owned(),
                source,
            });
        }
    };
    let meta = file.metadata().map_err(io_err("stat", path))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "it is a FIFO"
        } else if kind.is_dir() {
            "it is a directory"
        } else {
            "it is not a regular file"
        };
        return Err(unsafe_file(path, what));
    }
    if meta.nlink() != 1 {
        return Err(unsafe_file(
            path,
            format!(
                "it has {} hard links (another file's contents)",
                meta.nlink()
            ),
        ));
    }
    // Back to blocking I/O for the lock calls on a regular file.
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(Some(file))
}

static TEMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Creates a complete (full-size, mode 0666) region file beside `path` and links it into
/// place, so the path never names a partial file. `Ok(None)` when another process linked
/// one first.
fn create_new(path: &Path) -> Result<Option<File>, RegionError> {
    let name = path
        .file_name()
        .ok_or_else(|| unsafe_file(path, "it names no file"))?;
    let n = TEMP_COUNTER.fetch_add(1, Relaxed);
    let temp = path.with_file_name(format!(
        ".{}.{}.{n}.new",
        name.to_string_lossy(),
        std::process::id()
    ));
    let file =
        hami_kernel_locks::private_file::create_new(&temp).map_err(|source| RegionError::Open {
            path: path.to_owned(),
            source,
        })?;
    let finish = || -> Result<bool, RegionError> {
        // Our own new file: other users of the container must be able to attach (HAMi
        // #1090), whatever the umask.
        file.set_permissions(std::fs::Permissions::from_mode(0o666))
            .map_err(io_err("set the mode of", path))?;
        size_new(&file).map_err(io_err("size", path))?;
        match std::fs::hard_link(&temp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(source) => Err(RegionError::Open {
                path: path.to_owned(),
                source,
            }),
        }
    };
    let linked = finish();
    let _ = std::fs::remove_file(&temp);
    Ok(linked?.then_some(file))
}

/// Sizes a new region file: the pages its creator initialises and its first process claims
/// (header, device accounts, slot 0) written as zeros — the same bytes as a hole — and the
/// rest left sparse. Touching a hole through the mapping costs a block allocation in the
/// page fault, ~1.1 ms on the CI machine's ext4 (DRA prepare's largest single cost,
/// BENCHMARKS.md); the written pages cost ~0.1 ms.
fn size_new(file: &File) -> io::Result<()> {
    use std::io::Write;
    const PAGE: usize = 4096;
    let head = (slot_offset(0) + SLOT_SIZE).div_ceil(PAGE) * PAGE;
    (&*file).write_all(&vec![0u8; head.min(REGION_SIZE)])?;
    file.set_len(REGION_SIZE as u64)
}

/// For the device plugin: creates the container's region file at `path` (on the host, in
/// the container's fresh accounting directory) — full size, mode 0666, initialised with
/// `limits` (so readers see a valid region from the start and the limits are the plugin's,
/// not the first process's) — and returns its inode for the container's config
/// (`shared-cache-inode`). Fails if anything is already there.
pub fn prepare_file(path: &Path, limits: &Limits) -> Result<u64, RegionError> {
    let created =
        hami_kernel_locks::private_file::create_new(path).map_err(|source| RegionError::Open {
            path: path.to_owned(),
            source,
        })?;
    created
        .set_permissions(std::fs::Permissions::from_mode(0o666))
        .map_err(io_err("set the mode of", path))?;
    size_new(&created).map_err(io_err("size", path))?;
    let inode = created.metadata().map_err(io_err("stat", path))?.ino();
    drop(created);
    // Initialise through a session of our own, dropped at once (its slot is freed again).
    drop(Session::attach_expecting(path, limits, Some(inode))?);
    Ok(inode)
}

/// Whether a live process has the region at `path` attached: one of its slots' liveness
/// locks is held. The locks outlive a truncation of the file (a tenant's, or a crash's) and
/// go with their process, so a file no hook could map again is known to be unused when
/// this says `false`. No file: `false`; one that is not a plain file: an error.
pub fn attached_elsewhere(path: &Path) -> Result<bool, RegionError> {
    let Some(file) = open_existing(path)? else {
        return Ok(false);
    };
    any_record_locked_elsewhere(&file).map_err(io_err("probe the slot locks of", path))
}

/// The region file at `path`: the existing one if it is a plain file, else a new one.
fn open_region(path: &Path) -> Result<File, RegionError> {
    for _ in 0..8 {
        if let Some(file) = open_existing(path)? {
            return Ok(file);
        }
        if let Some(file) = create_new(path)? {
            return Ok(file);
        }
    }
    Err(unsafe_file(path, "it keeps appearing and disappearing"))
}

/// A second open file description of the same file (for liveness probes and reclaims).
fn reopen(path: &Path, owner: &File) -> Result<File, RegionError> {
    let probe = open_existing(path)?.ok_or_else(|| unsafe_file(path, "it was removed"))?;
    let (a, b) = (
        owner.metadata().map_err(io_err("stat", path))?,
        probe.metadata().map_err(io_err("stat", path))?,
    );
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        return Err(unsafe_file(path, "it was replaced while being opened"));
    }
    Ok(probe)
}

/// Clock ticks since boot at which this process started (`/proc/self/stat` field 22).
fn own_start_time() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let after_comm = &stat[stat.rfind(')')? + 1..];
            after_comm.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(0)
}

impl Session {
    /// Opens (creating if needed) the region at `path`, initialises it with `limits` if it is
    /// new, and claims a process slot. Limits of an existing region win; compare them with
    /// [`Session::limit_mismatches`].
    pub fn attach(path: &Path, limits: &Limits) -> Result<Session, RegionError> {
        Self::attach_expecting(path, limits, None)
    }

    /// As [`Session::attach`]; with `inode`, only the file the device plugin created
    /// ([`prepare_file`], whose inode it put in the container's config) is used: a missing
    /// file is never created and a replaced one is refused, so deleting the region (the
    /// directory is the container's) fails closed instead of starting fresh accounting.
    pub fn attach_expecting(
        path: &Path,
        limits: &Limits,
        inode: Option<u64>,
    ) -> Result<Session, RegionError> {
        // The directory is writable by the container: never follow a link, never use a
        // FIFO, directory or hard link, never change the mode or size of a file this hook
        // did not create (issue 14 item 8).
        let owner = match inode {
            None => open_region(path)?,
            Some(expected) => {
                let file = open_existing(path)?.ok_or_else(|| {
                    unsafe_file(
                        path,
                        "it is missing (the device plugin created it for this container, so it was deleted); restart the container",
                    )
                })?;
                let found = file.metadata().map_err(io_err("stat", path))?.ino();
                if found != expected {
                    return Err(unsafe_file(
                        path,
                        format!(
                            "it was replaced (inode {found}; the device plugin created inode {expected}); restart the container"
                        ),
                    ));
                }
                file
            }
        };
        let probe = reopen(path, &owner)?;
        flock_exclusive(&owner).map_err(io_err("lock", path))?;
        let attached = Self::attach_locked(path, owner, probe, limits);
        if let Ok(session) = &attached {
            flock_unlock(&session.owner).map_err(io_err("unlock", path))?;
        }
        // On error the files are closed, which drops the flock.
        attached
    }

    fn attach_locked(
        path: &Path,
        owner: File,
        probe: File,
        limits: &Limits,
    ) -> Result<Session, RegionError> {
        let len = owner.metadata().map_err(io_err("stat", path))?.len();
        if len != REGION_SIZE as u64 {
            // Never grown or shrunk: a file of another size is someone else's.
            let mut magic = [0u8; 4];
            if len >= 4 {
                use std::os::unix::fs::FileExt;
                owner
                    .read_exact_at(&mut magic, 0)
                    .map_err(io_err("read", path))?;
            }
            return Err(RegionError::Incompatible {
                path: path.to_owned(),
                found: format!(
                    "{len} bytes, magic {:#010x}, expected {REGION_SIZE} bytes",
                    u32::from_le_bytes(magic)
                ),
            });
        }
        // SAFETY: maps REGION_SIZE bytes of a file at least that long, shared; the result is
        // checked before use and unmapped in Drop.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                owner.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(RegionError::Io {
                what: "map",
                path: path.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        let map = NonNull::new(raw.cast::<RegionLayout>()).ok_or_else(|| RegionError::Io {
            what: "map",
            path: path.to_owned(),
            source: io::Error::other("mmap returned null"),
        })?;
        let mut session = Session {
            map,
            path: path.to_owned(),
            owner,
            probe,
            reclaim_mutex: Mutex::new(()),
            slot: usize::MAX,
            word: 0,
            ceiling: [LIMIT_NONE; MAX_DEVICES],
        };
        session.init_or_validate(limits)?;
        let slot = match session.claim_free_slot()? {
            Some(slot) => slot,
            None => {
                session.reclaim_dead_locked();
                session
                    .claim_free_slot()?
                    .ok_or_else(|| RegionError::Full {
                        path: path.to_owned(),
                    })?
            }
        };
        session.slot = slot;
        Ok(session)
    }

    fn layout(&self) -> &RegionLayout {
        // SAFETY: the mapping is REGION_SIZE bytes, page-aligned, alive until Drop, and every
        // field of RegionLayout is an atomic, so shared references are sound while other
        // processes write.
        unsafe { self.map.as_ref() }
    }

    fn init_or_validate(&self, limits: &Limits) -> Result<(), RegionError> {
        let header = &self.layout().header;
        let magic = header.magic.load(Acquire);
        if magic == 0 {
            // New, or its creator died before finishing: we hold the flock, so initialise.
            header.major.store(MAJOR_VERSION, Relaxed);
            header.minor.store(MINOR_VERSION, Relaxed);
            header.max_devices.store(MAX_DEVICES as u32, Relaxed);
            header.max_procs.store(MAX_PROCS as u32, Relaxed);
            header.slot_size.store(SLOT_SIZE as u32, Relaxed);
            header.region_size.store(REGION_SIZE as u64, Relaxed);
            header
                .configured_devices
                .store(limits.configured_devices(), Relaxed);
            for (account, limit) in self.layout().devices.iter().zip(limits.bytes) {
                account.limit.store(limit, Relaxed);
                account.used.store(0, Relaxed);
                account.peak.store(0, Relaxed);
                account.lock.store(0, Relaxed);
            }
            header.magic.store(MAGIC, Release);
            return Ok(());
        }
        let found = (
            magic,
            header.major.load(Relaxed),
            header.max_devices.load(Relaxed),
            header.max_procs.load(Relaxed),
            header.slot_size.load(Relaxed),
            header.region_size.load(Relaxed),
        );
        let expected = (
            MAGIC,
            MAJOR_VERSION,
            MAX_DEVICES as u32,
            MAX_PROCS as u32,
            SLOT_SIZE as u32,
            REGION_SIZE as u64,
        );
        if found != expected {
            return Err(RegionError::Incompatible {
                path: self.path.clone(),
                found: format!(
                    "magic {:#010x} version {}.{} devices {} processes {} slot {} B region {} B",
                    found.0,
                    found.1,
                    header.minor.load(Relaxed),
                    found.2,
                    found.3,
                    found.4,
                    found.5
                ),
            });
        }
        Ok(())
    }

    /// Claims the lowest free slot whose record lock we can take. Caller holds the flock.
    fn claim_free_slot(&mut self) -> Result<Option<usize>, RegionError> {
        let layout = self.layout();
        for (index, slot) in layout.slots.iter().enumerate() {
            if slot.status.load(Acquire) != SLOT_FREE {
                continue;
            }
            let locked = try_lock_record(&self.owner, slot_offset(index)).map_err(|source| {
                RegionError::Io {
                    what: "lock a slot of",
                    path: self.path.clone(),
                    source,
                }
            })?;
            if !locked {
                continue; // its previous owner is between "free" and closing its file
            }
            let generation = slot.generation.load(Relaxed).wrapping_add(1);
            slot.generation.store(generation, Relaxed);
            // SAFETY: getpid has no preconditions.
            slot.pid.store(unsafe { libc::getpid() }, Relaxed);
            slot.hostpid.store(0, Relaxed);
            slot.start_time.store(own_start_time(), Relaxed);
            for device in 0..MAX_DEVICES {
                slot.monitor_used[device].store(0, Relaxed);
                slot.util[device].dec_util.store(0, Relaxed);
                slot.util[device].enc_util.store(0, Relaxed);
                slot.util[device].sm_util.store(0, Relaxed);
            }
            slot.status.store(SLOT_ACTIVE, Release);
            layout
                .header
                .slot_high_water
                .fetch_max(index as u32 + 1, Relaxed);
            self.word = lock_word(index, generation);
            return Ok(Some(index));
        }
        Ok(None)
    }

    /// The path this session mapped.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This process's slot index: stable for the session's life.
    pub fn slot_index(&self) -> usize {
        self.slot
    }

    /// Caps this session's limits at `ceiling` (the device plugin's read-only config): the
    /// limit in force on each device is then the lower of the region's stored limit and the
    /// ceiling, so a process that writes the region (every process of the container can)
    /// may lower the limit but cannot raise it past the config's (issue 26 item 3).
    pub fn cap_limits(&mut self, ceiling: &Limits) {
        self.ceiling = ceiling.bytes;
    }

    /// Devices whose stored limit differs from `limits`: `(device, stored, wanted)`.
    pub fn limit_mismatches(&self, limits: &Limits) -> Vec<(usize, u64, u64)> {
        self.layout()
            .devices
            .iter()
            .zip(limits.bytes)
            .enumerate()
            .filter_map(|(device, (account, wanted))| {
                let stored = account.limit.load(Relaxed);
                (stored != wanted).then_some((device, stored, wanted))
            })
            .collect()
    }

    fn slot_alive(&self, index: usize) -> bool {
        // A failing probe counts as alive: never take bytes or locks away on doubt.
        record_locked_elsewhere(&self.probe, slot_offset(index)).unwrap_or(true)
    }

    /// Takes device `device`'s accounting lock. If its holder died (its slot's record lock
    /// is gone, or the slot was freed or claimed again since, also by this process), the
    /// lock is taken over and the device total rebuilt from the slots, so a holder killed
    /// mid-update neither blocks nor skews anyone.
    pub fn lock_device(&self, device: usize) -> Option<DeviceLock<'_>> {
        let account = self.layout().devices.get(device)?;
        let mut attempts: u32 = 0;
        loop {
            match account
                .lock
                .compare_exchange_weak(0, self.word, Acquire, Relaxed)
            {
                Ok(_) => {
                    return Some(DeviceLock {
                        account,
                        word: self.word,
                    });
                }
                Err(holder_word) => {
                    attempts = attempts.wrapping_add(1);
                    if holder_word != 0
                        && attempts.is_multiple_of(64)
                        && self.holder_gone(holder_word)
                        && account
                            .lock
                            .compare_exchange(holder_word, self.word, Acquire, Relaxed)
                            .is_ok()
                    {
                        self.rebuild_total(device);
                        return Some(DeviceLock {
                            account,
                            word: self.word,
                        });
                    }
                    hami_kernel_locks::lock_backoff::wait(attempts, 16);
                }
            }
        }
    }

    /// Whether the holder `word` names is gone ([`crate::takeover::stale`] over its slot).
    fn holder_gone(&self, word: u64) -> bool {
        crate::takeover::stale(word, self.word, |index| {
            let slot = self.layout().slots.get(index)?;
            let free = slot.status.load(Acquire) != SLOT_ACTIVE;
            Some(crate::takeover::HolderSlot {
                free,
                generation: slot.generation.load(Acquire),
                alive: !free && self.slot_alive(index),
            })
        })
    }

    /// Caller holds `device`'s lock.
    fn rebuild_total(&self, device: usize) {
        let layout = self.layout();
        let high = layout.header.slot_high_water.load(Relaxed) as usize;
        let total = accounting::sum_of_slots(
            layout.slots[..high.min(MAX_PROCS)]
                .iter()
                .map(|slot| slot.used[device].load(Relaxed)),
        );
        layout.devices[device].used.store(total, Relaxed);
    }

    fn own_slot(&self) -> &ProcSlot {
        &self.layout().slots[self.slot]
    }

    fn reserve_once(&self, device: usize, size: u64) -> Result<(), ReserveError> {
        let guard = self
            .lock_device(device)
            .ok_or(ReserveError::NoSuchDevice(device))?;
        let account = guard.account;
        let used = account.used.load(Relaxed);
        let limit = accounting::limit_in_force(account.limit.load(Relaxed), self.ceiling[device]);
        let total = accounting::reserve(used, limit, size)
            .map_err(|over| ReserveError::OverLimit { device, over })?;
        account.used.store(total, Relaxed);
        account.peak.fetch_max(total, Relaxed);
        let mine = &self.own_slot().used[device];
        mine.store(mine.load(Relaxed).saturating_add(size), Relaxed);
        Ok(())
    }

    /// Reserves `size` bytes on `device` before the real allocation. Over the limit, dead
    /// processes are reclaimed once and the reservation retried.
    pub fn reserve(&self, device: usize, size: u64) -> Result<(), ReserveError> {
        match self.reserve_once(device, size) {
            Err(ReserveError::OverLimit { .. }) if self.reclaim_dead().slots > 0 => {
                self.reserve_once(device, size)
            }
            other => other,
        }
    }

    /// Returns up to `size` bytes this process holds on `device` (after a free, or a failed
    /// allocation). Returns the bytes actually returned.
    pub fn release(&self, device: usize, size: u64) -> u64 {
        let Some(guard) = self.lock_device(device) else {
            return 0;
        };
        let mine = &self.own_slot().used[device];
        let taken = accounting::releasable(mine.load(Relaxed), size);
        mine.store(mine.load(Relaxed) - taken, Relaxed);
        let account = guard.account;
        account
            .used
            .store(account.used.load(Relaxed).saturating_sub(taken), Relaxed);
        taken
    }

    /// Bytes this process holds on `device`.
    pub fn own_used(&self, device: usize) -> u64 {
        self.layout()
            .slots
            .get(self.slot)
            .and_then(|slot| slot.used.get(device))
            .map_or(0, |used| used.load(Relaxed))
    }

    /// The device's usage, limit in force (the stored one, capped by
    /// [`Session::cap_limits`]) and peak (no lock: a consistent-enough read for reporting).
    pub fn device_usage(&self, device: usize) -> Option<DeviceUsage> {
        let account = self.layout().devices.get(device)?;
        Some(DeviceUsage {
            used: account.used.load(Relaxed),
            limit: accounting::limit_in_force(account.limit.load(Relaxed), self.ceiling[device]),
            peak: account.peak.load(Relaxed),
        })
    }

    /// Changes `device`'s limit in force (an operator's or monitor's action; HAMi's monitor
    /// does the same). Bytes already reserved stay reserved: usage may then sit above the
    /// limit, which `ACTIVE_OOM_KILLER` acts on.
    pub fn set_limit(&self, device: usize, bytes: u64) -> Result<(), ReserveError> {
        let guard = self
            .lock_device(device)
            .ok_or(ReserveError::NoSuchDevice(device))?;
        guard.account.limit.store(bytes, Relaxed);
        Ok(())
    }

    /// Frees the slots of processes that died without detaching and returns their bytes.
    pub fn reclaim_dead(&self) -> Reclaimed {
        let _threads = self
            .reclaim_mutex
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if flock_exclusive(&self.probe).is_err() {
            return Reclaimed::default();
        }
        let reclaimed = self.reclaim_dead_locked();
        let _ = flock_unlock(&self.probe);
        reclaimed
    }

    /// Caller holds the region's flock (through either file).
    fn reclaim_dead_locked(&self) -> Reclaimed {
        let layout = self.layout();
        let high = (layout.header.slot_high_water.load(Relaxed) as usize).min(MAX_PROCS);
        let mut reclaimed = Reclaimed::default();
        for index in 0..high {
            let slot = &layout.slots[index];
            if index == self.slot
                || slot.status.load(Acquire) != SLOT_ACTIVE
                || self.slot_alive(index)
            {
                continue;
            }
            reclaimed.slots += 1;
            reclaimed.bytes += self.return_slot_bytes(index);
            slot.pid.store(0, Relaxed);
            slot.status.store(SLOT_FREE, Release);
        }
        reclaimed
    }

    /// Moves every byte slot `index` holds back to its device, taking over any device lock
    /// the slot's (dead) owner held.
    fn return_slot_bytes(&self, index: usize) -> u64 {
        let layout = self.layout();
        let slot = &layout.slots[index];
        let mut returned = 0u64;
        for device in 0..MAX_DEVICES {
            let held_by_slot =
                lock_holder(layout.devices[device].lock.load(Relaxed)) == Some(index);
            if slot.used[device].load(Relaxed) == 0 && !held_by_slot {
                continue;
            }
            let Some(guard) = self.lock_device(device) else {
                continue;
            };
            let bytes = slot.used[device].swap(0, Relaxed);
            let account = guard.account;
            account
                .used
                .store(account.used.load(Relaxed).saturating_sub(bytes), Relaxed);
            returned = returned.saturating_add(bytes);
        }
        returned
    }

    /// Every claimed slot, with liveness from its record lock.
    pub fn slots(&self) -> Vec<SlotView> {
        let layout = self.layout();
        let high = (layout.header.slot_high_water.load(Relaxed) as usize).min(MAX_PROCS);
        layout.slots[..high]
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.status.load(Acquire) == SLOT_ACTIVE)
            .map(|(index, slot)| SlotView {
                index,
                pid: slot.pid.load(Relaxed),
                hostpid: slot.hostpid.load(Relaxed),
                alive: self.slot_alive(index),
                used: (0..MAX_DEVICES)
                    .filter_map(|d| {
                        let bytes = slot.used[d].load(Relaxed);
                        (bytes > 0).then_some((d, bytes))
                    })
                    .collect(),
            })
            .collect()
    }

    /// Leaves the slot and its bytes behind, exactly as a SIGKILL would: the kernel drops the
    /// slot's record lock when the files close, and the next reclaim returns the bytes.
    /// A forked child must do this with the session it inherited from its parent.
    pub fn abandon(self) {
        let mut this = std::mem::ManuallyDrop::new(self);
        this.slot = usize::MAX;
        this.unmap();
        // SAFETY: each field is dropped exactly once, here; `this` is never used again.
        unsafe {
            std::ptr::drop_in_place(&mut this.owner);
            std::ptr::drop_in_place(&mut this.probe);
            std::ptr::drop_in_place(&mut this.path);
            std::ptr::drop_in_place(&mut this.reclaim_mutex);
        }
    }

    fn unmap(&mut self) {
        // SAFETY: the mapping was created with REGION_SIZE bytes in attach and is unmapped
        // once (callers are Drop and abandon, which are exclusive).
        unsafe { libc::munmap(self.map.as_ptr().cast(), REGION_SIZE) };
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.slot < MAX_PROCS {
            self.return_slot_bytes(self.slot);
            let slot = self.own_slot();
            slot.pid.store(0, Relaxed);
            slot.status.store(SLOT_FREE, Release);
        }
        self.unmap();
        // The files close after this, dropping the record lock.
    }
}
