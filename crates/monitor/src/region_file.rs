//! Region files as tenants can leave them: the thin shell that opens and copies them.
//!
//! A container's cache directory is writable by the container, so what sits at a `.cache`
//! name may be a FIFO (an `open` that blocks forever), a symlink to another tenant's file, a
//! huge sparse file, or a region truncated while the monitor reads it. Here:
//! - opens are `O_NONBLOCK | O_NOFOLLOW` and only regular files are kept (`fstat`): a FIFO or
//!   a link costs its own series and an error count, never a blocked thread;
//! - every read is a `pread` into a buffer, after an `fstat`, of the ranges the layout needs
//!   (header, the slots in use, the tail), never a mapping: truncation gives a short read, not
//!   SIGBUS, and a sparse terabyte costs what a real region costs;
//! - a file's reads share a time budget ([`READ_BUDGET`]); a file that exceeds it is dropped
//!   and re-opened at the next scan.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::region_bytes::Segments;

/// How long reading one file may take per scrape.
pub const READ_BUDGET: Duration = Duration::from_millis(50);

/// Why a region file could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Not a regular file; what it is.
    #[error(
        "is a {0}, not a regular file: region files are plain files the hook creates; remove it"
    )]
    NotRegular(&'static str),
    /// A symbolic link.
    #[error("is a symbolic link, which is never followed: remove it")]
    Symlink,
    /// The file shrank while being read.
    #[error("shrank while being read ({got} of {wanted} bytes at offset {at}): truncated")]
    ShortRead {
        /// Offset read from.
        at: usize,
        /// Bytes wanted.
        wanted: usize,
        /// Bytes got.
        got: usize,
    },
    /// Reading took longer than [`READ_BUDGET`].
    #[error("reading took more than {} ms: dropped until the next scan", READ_BUDGET.as_millis())]
    TooSlow,
    /// Any other I/O error.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl FileError {
    /// The `kind` label of the error counter.
    pub fn kind(&self) -> &'static str {
        match self {
            FileError::NotRegular(_) | FileError::Symlink => "cache_not_regular",
            FileError::ShortRead { .. } => "cache_truncated",
            FileError::TooSlow => "cache_slow",
            FileError::Io(_) => "cache_io",
        }
    }
}

fn type_name(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "FIFO"
    } else if t.is_dir() {
        "directory"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// An open region file (regular, not followed through a link).
#[derive(Debug)]
pub struct RegionFile {
    file: File,
}

/// Opens `path` for reading (and writing, with `write`) without blocking (a FIFO would
/// hang the monitor), without following a final symlink (a tenant's link to a host file is
/// `Symlink`) and without taking a controlling terminal.
fn open_refusing(path: &Path, write: bool) -> Result<File, FileError> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                FileError::Symlink
            } else {
                FileError::Io(e)
            }
        })
}

impl RegionFile {
    /// Opens `path` without blocking and without following a final symlink; refuses
    /// anything but a regular file.
    pub fn open(path: &Path) -> Result<RegionFile, FileError> {
        let file = open_refusing(path, false)?;
        let kind = file.metadata()?.file_type();
        if !kind.is_file() {
            return Err(FileError::NotRegular(type_name(kind)));
        }
        Ok(RegionFile { file })
    }

    /// The open file (for the OFD liveness probes of our own region).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Device and inode (as `/proc/<pid>/maps` shows them).
    pub fn id(&self) -> Result<crate::host_pids::FileId, FileError> {
        use std::os::unix::fs::MetadataExt;
        let meta = self.file.metadata()?;
        let (major, minor) = crate::host_pids::dev_numbers(meta.dev());
        Ok((major, minor, meta.ino()))
    }

    /// Stores `value` (4 bytes, little endian) at `offset` of the file at `path`, opened
    /// with the same refusals, only when it is still the file `id` (same device and inode: a
    /// tenant who swapped the name meanwhile gets nothing written) and the 4 bytes at
    /// `guard.0` still read `guard.1` (the slot was not reused by another process meanwhile).
    pub fn write_i32_at(
        path: &Path,
        id: crate::host_pids::FileId,
        guard: (usize, i32),
        offset: usize,
        value: i32,
    ) -> Result<(), FileError> {
        use std::os::unix::fs::MetadataExt;
        let file = open_refusing(path, true)?;
        let theirs = file.metadata()?;
        if !theirs.file_type().is_file() {
            return Err(FileError::NotRegular(type_name(theirs.file_type())));
        }
        let (major, minor) = crate::host_pids::dev_numbers(theirs.dev());
        if (major, minor, theirs.ino()) != id {
            return Err(FileError::Io(io::Error::other(
                "the file was replaced since it was opened",
            )));
        }
        let mut now = [0u8; 4];
        file.read_exact_at(&mut now, guard.0 as u64)?;
        if i32::from_le_bytes(now) != guard.1 {
            return Ok(());
        }
        file.write_all_at(&value.to_le_bytes(), offset as u64)?;
        Ok(())
    }

    /// The size now (`fstat`).
    pub fn size(&self) -> Result<usize, FileError> {
        Ok(usize::try_from(self.file.metadata()?.len()).unwrap_or(usize::MAX))
    }

    /// Starts one bounded read of this file: `len` is the size the readers see.
    pub fn reader(&self, len: usize) -> BudgetedRead<'_> {
        BudgetedRead {
            file: &self.file,
            segments: Segments::new(len),
            deadline: Instant::now() + READ_BUDGET,
        }
    }
}

/// Reads of one file within one time budget, collected as [`Segments`].
pub struct BudgetedRead<'a> {
    file: &'a File,
    segments: Segments,
    deadline: Instant,
}

impl BudgetedRead<'_> {
    /// Copies `range` (clipped to the file's size) into the segments.
    pub fn read(&mut self, range: Range<usize>) -> Result<&Segments, FileError> {
        use crate::region_bytes::RegionBytes;
        let end = range.end.min(self.segments.len());
        if range.start < end {
            let wanted = end - range.start;
            let mut buf = vec![0u8; wanted];
            let mut got = 0;
            while got < wanted {
                match self
                    .file
                    .read_at(&mut buf[got..], (range.start + got) as u64)
                {
                    Ok(0) => {
                        return Err(FileError::ShortRead {
                            at: range.start,
                            wanted,
                            got,
                        });
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
                if Instant::now() > self.deadline {
                    return Err(FileError::TooSlow);
                }
            }
            self.segments.push(range.start, buf);
        }
        Ok(&self.segments)
    }

    /// The bytes read.
    pub fn finish(self) -> Segments {
        self.segments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region_bytes::RegionBytes;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("hami-region-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn fifo_symlink_and_directory_are_refused_without_blocking() {
        let dir = temp_dir("kinds");
        let fifo = dir.join("f.cache");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        assert_eq!(
            RegionFile::open(&fifo).unwrap_err().kind(),
            "cache_not_regular"
        );
        std::fs::write(dir.join("real"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("l.cache")).unwrap();
        assert!(matches!(
            RegionFile::open(&dir.join("l.cache")),
            Err(FileError::Symlink)
        ));
        std::fs::create_dir(dir.join("d.cache")).unwrap();
        assert!(matches!(
            RegionFile::open(&dir.join("d.cache")),
            Err(FileError::NotRegular("directory"))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_shorter_than_fstat_said_is_a_short_read_not_a_fault() {
        let dir = temp_dir("short");
        let path = dir.join("r.cache");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let file = RegionFile::open(&path).unwrap();
        let mut read = file.reader(file.size().unwrap());
        assert_eq!(read.read(0..16).unwrap().byte_at(3), 7);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        assert!(matches!(
            read.read(1000..2000),
            Err(FileError::ShortRead { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
