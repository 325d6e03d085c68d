//! Attaching a session: open (or create) and map the region, initialise or validate its
//! header and limits, claim a slot; detaching on drop, or abandoning as a SIGKILL would.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::{
    LIMIT_NONE, MAGIC, MAJOR_VERSION, MAX_DEVICES, MAX_PROCS, MINOR_VERSION, REGION_SIZE,
    RegionLayout, SLOT_ACTIVE, SLOT_FREE, SLOT_SIZE, lock_word, slot_offset,
};
use hami_kernel_locks::file_lock::{flock_exclusive, flock_unlock, try_lock_record};

use super::*;

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

    pub(super) fn attach_locked(
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

    pub(super) fn layout(&self) -> &RegionLayout {
        // SAFETY: the mapping is REGION_SIZE bytes, page-aligned, alive until Drop, and every
        // field of RegionLayout is an atomic, so shared references are sound while other
        // processes write.
        unsafe { self.map.as_ref() }
    }

    pub(super) fn init_or_validate(&self, limits: &Limits) -> Result<(), RegionError> {
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
    pub(super) fn claim_free_slot(&mut self) -> Result<Option<usize>, RegionError> {
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

    pub(super) fn unmap(&mut self) {
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
