//! Kernel-held locks on the region file, released by the kernel when the holder dies (so a
//! SIGKILL never leaves a lock behind, unlike the reference's `sem_t`, HAMi #2500):
//! - `flock` on the whole file serialises initialisation, slot claims and reservations;
//! - an open-file-description (OFD) record lock on one byte per slot, past the end of the
//!   region, is held by the slot's owner for life: "the byte is locked" says it is alive.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let rc = call();
        if rc != -1 {
            return Ok(rc);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

pub(crate) fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: flock on an fd we own; no memory is passed.
    retry_eintr(|| unsafe { libc::flock(fd, operation) }).map(drop)
}

fn record(kind: libc::c_int, offset: usize) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all-zero is a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = offset as libc::off_t;
    lock.l_len = 1;
    lock.l_pid = 0; // required to be 0 for OFD locks
    lock
}

/// Takes the write record lock on byte `offset` for this OFD without waiting.
pub(crate) fn try_lock_record(file: &File, offset: usize) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    let lock = record(libc::F_WRLCK, offset);
    // SAFETY: F_OFD_SETLK reads the struct we pass; it lives across the call.
    match retry_eintr(|| unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &lock) }) {
        Ok(_) => Ok(true),
        Err(err) if matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
            Ok(false)
        }
        Err(err) => Err(err),
    }
}

/// Whether another OFD holds a record lock on byte `offset`.
pub(crate) fn record_locked_elsewhere(file: &File, offset: usize) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    let mut lock = record(libc::F_WRLCK, offset);
    // SAFETY: F_OFD_GETLK writes into the struct we pass; it lives across the call.
    retry_eintr(|| unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut lock) })?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}
