//! Atomic file writes: a reader (the container runtime reading a CDI spec, a restarted
//! plugin reading its checkpoint) sees the old file or the new one, never half of one.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` via a temporary file in the same directory and a rename; with
/// `durable`, also fsync of the file and the directory (only the checkpoint needs it: the
/// other files are re-derived from it). `mode` sets the permission bits (e.g. 0o444 for a
/// config the container must not change).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    std::fs::rename(&tmp, path)?;
    if durable {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Writes a file that nothing reads until a later step publishes it (a claim's hook config:
/// its container starts only after the CDI spec naming it is written): created in place,
/// with no temporary file or rename (one creation on the disk instead of two operations).
/// A file already there — a failed or interrupted earlier attempt — is replaced atomically.
pub fn write_unpublished(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let mut f = match created {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return write_atomic(path, bytes, mode, false);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return write_atomic(path, bytes, mode, false);
        }
        Err(e) => return Err(e),
    };
    f.write_all(bytes)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// Makes sure `path` holds exactly `bytes` (after a crash a non-durable file may be
/// missing or empty): rewrites it only when it differs.
pub fn ensure(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    match std::fs::read(path) {
        Ok(have) if have == bytes => Ok(()),
        _ => write_atomic(path, bytes, mode, false),
    }
}

/// Removes a file; absent is fine (unprepare is idempotent), also where a parent is not a
/// directory (nothing can be there).
pub fn remove_if_present(path: &Path) -> std::io::Result<()> {
    use std::io::ErrorKind::{NotADirectory, NotFound};
    match std::fs::remove_file(path) {
        Err(e) if !matches!(e.kind(), NotFound | NotADirectory) => Err(e),
        _ => Ok(()),
    }
}
