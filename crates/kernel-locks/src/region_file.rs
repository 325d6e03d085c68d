//! The one rule for a region file a plugin prepares in a container's (or claim's) cache
//! directory, for both regions (HIP `hami-region`, HAMi-core `hami-cuda-region`): keep a
//! plain file of the region's size; replace one no hook could map — empty or cut short (a
//! crash between its creation and sizing, a power loss before its blocks were written, a
//! tenant's truncation), or not a plain file (a link or FIFO planted in the directory) —
//! unless a live process still has it attached; never guess at a directory.
//!
//! Why one rule: both plugins and the DRA driver prepare region files, and the rule was
//! written (and fixed) in each. Removing, not repairing in place: an inode some container
//! still has bind-mounted is never reset under it. A file kept because processes have it
//! attached is refused, naming why: they fail closed on it, and a fresh region beside them
//! would let the pod count its memory twice; a later try replaces it once they exit.
//!
//! [`decide`] is the decision (pure); [`check`] and [`prepare`] are its small I/O.

use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// What is at a region file's path, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing.
    Absent,
    /// A plain file of `len` bytes.
    Plain {
        /// Its size.
        len: u64,
    },
    /// A directory.
    Directory,
    /// A symbolic link, FIFO, socket or device: never something a hook maps.
    Other,
}

/// What to do with what [`Found`] at the path (pure: [`decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing there: the caller creates the region.
    Create,
    /// A region a hook can map: kept (its inode is the one the hook config pins).
    Keep,
    /// A plain file of another size: removed unless a live process has it attached (the
    /// caller probes, then [`after_probe`]).
    ProbeThenReplace,
    /// A link, FIFO, socket or device: removed (never attached: only a plain file can be).
    Replace,
    /// A directory: refused, naming it.
    Refuse,
}

/// The decision for what is at the path of a region of `size` bytes.
pub fn decide(found: Found, size: u64) -> Action {
    match found {
        Found::Absent => Action::Create,
        Found::Plain { len } if len == size => Action::Keep,
        Found::Plain { .. } => Action::ProbeThenReplace,
        Found::Other => Action::Replace,
        Found::Directory => Action::Refuse,
    }
}

/// The decision for a cut-short plain file once its slot locks were probed: kept when a
/// live process has it attached, else replaced.
pub fn after_probe(attached: bool) -> Action {
    if attached {
        Action::Keep
    } else {
        Action::Replace
    }
}

/// What [`check`] left at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionFile {
    /// A plain file of the region's size, with its inode: kept.
    Usable(u64),
    /// One no hook could map, kept because live processes still have it attached.
    InUse,
    /// None there, or there was one no hook could use and it was removed.
    Absent,
}

/// Applies the rule to `path` for a region of `size` bytes: removes what no hook could map
/// and no process has attached; the caller makes the new one. A directory is an error.
pub fn check(path: &Path, size: u64) -> io::Result<RegionFile> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(RegionFile::Absent),
        Err(e) => return Err(annotate(e, "checking", path)),
        Ok(meta) => meta,
    };
    let kind = meta.file_type();
    let found = if kind.is_file() {
        Found::Plain { len: meta.len() }
    } else if kind.is_dir() {
        Found::Directory
    } else {
        Found::Other
    };
    let mut action = decide(found, size);
    if action == Action::ProbeThenReplace {
        let attached =
            attached_elsewhere(path).map_err(|e| annotate(e, "checking who uses", path))?;
        action = after_probe(attached);
        if action == Action::Keep {
            return Ok(RegionFile::InUse);
        }
    }
    match action {
        Action::Create => Ok(RegionFile::Absent),
        Action::Keep => Ok(RegionFile::Usable(meta.ino())),
        Action::Refuse => Err(io::Error::other(format!(
            "{} is a directory, not a region file; remove it",
            path.display()
        ))),
        Action::Replace | Action::ProbeThenReplace => {
            std::fs::remove_file(path)
                .map_err(|e| annotate(e, "removing the unusable region file", path))?;
            Ok(RegionFile::Absent)
        }
    }
}

/// The region at `path` for a plugin: the usable one already there (a repeated Allocate or
/// prepare), else a new one made by `create` (which returns its inode) after [`check`]
/// removed what no hook could map. A file processes still have attached is an error naming
/// why; so is a directory, or something not a region appearing meanwhile.
pub fn prepare(
    path: &Path,
    size: u64,
    create: impl FnOnce() -> io::Result<u64>,
) -> io::Result<u64> {
    match check(path, size)? {
        RegionFile::Usable(inode) => return Ok(inode),
        RegionFile::InUse => {
            return Err(io::Error::other(format!(
                "{} is cut short while processes still have it attached; it is replaced once they exit",
                path.display()
            )));
        }
        RegionFile::Absent => {}
    }
    match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Made meanwhile by someone else: used only if it is a region.
            let meta = std::fs::symlink_metadata(path)?;
            if meta.is_file() && meta.len() == size {
                Ok(meta.ino())
            } else {
                Err(io::Error::other(format!(
                    "{} exists and is not a region file; remove it",
                    path.display()
                )))
            }
        }
        other => other,
    }
}

/// Whether another open file description holds a record lock on the plain file at `path`
/// (a live process's slot: the locks outlive a truncation and go with their process).
fn attached_elsewhere(path: &Path) -> io::Result<bool> {
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        // O_NONBLOCK: a FIFO swapped in meanwhile must not wait for a writer.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    crate::file_lock::any_record_locked_elsewhere(&file)
}

fn annotate(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_keeps_regions_replaces_the_unmappable_and_refuses_directories() {
        assert_eq!(decide(Found::Absent, 10), Action::Create);
        assert_eq!(decide(Found::Plain { len: 10 }, 10), Action::Keep);
        assert_eq!(
            decide(Found::Plain { len: 0 }, 10),
            Action::ProbeThenReplace
        );
        assert_eq!(
            decide(Found::Plain { len: 11 }, 10),
            Action::ProbeThenReplace
        );
        assert_eq!(decide(Found::Other, 10), Action::Replace);
        assert_eq!(decide(Found::Directory, 10), Action::Refuse);
        assert_eq!(after_probe(true), Action::Keep);
        assert_eq!(after_probe(false), Action::Replace);
    }

    #[test]
    fn prepare_applies_the_rule_on_disk() {
        let _fork = crate::FORK_IN_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("hami-region-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("region");
        let make = || {
            let f = crate::private_file::create_new(&path)?;
            f.set_len(64)?;
            Ok(f.metadata()?.ino())
        };
        // Cut short by an interrupted try: replaced; then found again as it is.
        std::fs::write(&path, b"").unwrap();
        let inode = prepare(&path, 64, make).unwrap();
        assert_eq!(
            prepare(&path, 64, || -> io::Result<u64> { unreachable!() }).unwrap(),
            inode
        );
        // A planted link: the link goes, its target is untouched.
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        prepare(&path, 64, make).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // Cut short under a live process (a record lock held): kept and refused.
        let holder = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        assert!(crate::file_lock::try_lock_record(&holder, 0).unwrap());
        holder.set_len(3).unwrap();
        let e = prepare(&path, 64, make).unwrap_err();
        assert!(e.to_string().contains("still have it attached"), "{e}");
        assert_eq!(check(&path, 64).unwrap(), RegionFile::InUse);
        drop(holder);
        assert!(matches!(check(&path, 64).unwrap(), RegionFile::Absent));
        // A directory is not guessed at.
        std::fs::create_dir(&path).unwrap();
        let e = prepare(&path, 64, make).unwrap_err();
        assert!(
            e.to_string()
                .contains("is a directory, not a region file; remove it"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
