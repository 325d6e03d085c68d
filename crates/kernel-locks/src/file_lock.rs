//! Kernel-held locks on a region file. Both kinds are released by the kernel when the
//! holder dies, which is what makes SIGKILL harmless (unlike a `sem_t` in shared memory,
//! HAMi #2500):
//! - `flock` on the whole file serialises slot claims and reclaims;
//! - an open-file-description (OFD) record lock on one byte per slot is held by the slot's
//!   owner for life: "the byte is locked" is the liveness signal. It needs no PID, so PID
//!   reuse and PID namespaces cannot fool it.

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

/// `flock(2)` with `operation` (`LOCK_EX`, `LOCK_SH`, `LOCK_UN`, optionally `| LOCK_NB`).
pub fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: flock on an fd we own; no memory is passed.
    retry_eintr(|| unsafe { libc::flock(fd, operation) }).map(drop)
}

/// Takes the whole-file exclusive `flock`, waiting for it.
pub fn flock_exclusive(file: &File) -> io::Result<()> {
    flock(file, libc::LOCK_EX)
}

/// Drops the whole-file `flock`.
pub fn flock_unlock(file: &File) -> io::Result<()> {
    flock(file, libc::LOCK_UN)
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

/// Tries to take the write record lock on byte `offset` through this file's OFD, without
/// waiting. `Ok(false)` when another OFD holds it.
pub fn try_lock_record(file: &File, offset: usize) -> io::Result<bool> {
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

/// Whether some other OFD holds a record lock on byte `offset` (as seen from this OFD:
/// locks this OFD holds itself do not count).
pub fn record_locked_elsewhere(file: &File, offset: usize) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    let mut lock = record(libc::F_WRLCK, offset);
    // SAFETY: F_OFD_GETLK writes into the struct we pass; it lives across the call.
    retry_eintr(|| unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut lock) })?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

/// Whether some other OFD holds a record lock anywhere in the file, also past its end (a
/// file cut short keeps the locks its holders took on it).
pub fn any_record_locked_elsewhere(file: &File) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    let mut lock = record(libc::F_WRLCK, 0);
    lock.l_len = 0; // to the end of any size the file has or gets
    // SAFETY: F_OFD_GETLK writes into the struct we pass; it lives across the call.
    retry_eintr(|| unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut lock) })?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_locks_are_per_open_file_description() {
        let _no_fork_meanwhile = crate::FORK_IN_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("hami-region-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, [0u8; 16]).unwrap();
        let owner = File::options().read(true).write(true).open(&path).unwrap();
        let other = File::options().read(true).write(true).open(&path).unwrap();
        assert!(!record_locked_elsewhere(&other, 3).unwrap());
        assert!(try_lock_record(&owner, 3).unwrap());
        assert!(record_locked_elsewhere(&other, 3).unwrap());
        assert!(!record_locked_elsewhere(&owner, 3).unwrap());
        assert!(!try_lock_record(&other, 3).unwrap());
        assert!(!record_locked_elsewhere(&other, 4).unwrap());
        drop(owner);
        assert!(!record_locked_elsewhere(&other, 3).unwrap());
        // Anywhere in the file, and past its end once it is cut short.
        assert!(!any_record_locked_elsewhere(&other).unwrap());
        assert!(try_lock_record(&other, 12).unwrap());
        let third = File::options().read(true).write(true).open(&path).unwrap();
        third.set_len(0).unwrap();
        assert!(any_record_locked_elsewhere(&third).unwrap());
        assert!(
            !any_record_locked_elsewhere(&other).unwrap(),
            "its own lock does not count"
        );
        drop(other);
        assert!(!any_record_locked_elsewhere(&third).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
