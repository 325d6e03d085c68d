//! The region file itself: opened without following links, created whole under a temporary
//! name and renamed into place, checked for its owner and size, mapped; and whether a live
//! process holds it ([`attached_elsewhere`]), which decides whether it may be replaced.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use std::sync::atomic::Ordering::Relaxed;

use crate::layout::{REGION_SIZE, SLOT_SIZE, slot_offset};
use hami_kernel_locks::file_lock::any_record_locked_elsewhere;

use super::*;

pub(super) fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> RegionError + 'a {
    move |source| RegionError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

pub(super) fn unsafe_file(path: &Path, reason: impl Into<String>) -> RegionError {
    RegionError::Unsafe {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Opens an existing region file without following a symbolic link, and checks that it is
/// a regular file with one link; `Ok(None)` when there is none.
pub(super) fn open_existing(path: &Path) -> Result<Option<File>, RegionError> {
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

pub(super) static TEMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Creates a complete (full-size, mode 0666) region file beside `path` and links it into
/// place, so the path never names a partial file. `Ok(None)` when another process linked
/// one first.
pub(super) fn create_new(path: &Path) -> Result<Option<File>, RegionError> {
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
pub(super) fn size_new(file: &File) -> io::Result<()> {
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
pub(super) fn open_region(path: &Path) -> Result<File, RegionError> {
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
pub(super) fn reopen(path: &Path, owner: &File) -> Result<File, RegionError> {
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
pub(super) fn own_start_time() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let after_comm = &stat[stat.rfind(')')? + 1..];
            after_comm.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(0)
}
