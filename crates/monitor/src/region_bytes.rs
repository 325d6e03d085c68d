//! Byte access to a shared region: a plain slice (tests, golden files) or a read-only
//! mapping that other processes write while we read.
//!
//! The readers of the region layouts are written against [`RegionBytes`] so they stay pure:
//! a golden test hands them a `Vec<u8>`, the monitor a [`MappedRegion`]. Reads out of
//! bounds return 0 (the readers check the length first; this is only a second guard).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Little-endian reads at byte offsets.
pub trait RegionBytes {
    fn len(&self) -> usize;
    fn byte_at(&self, offset: usize) -> u8;
    fn u32_at(&self, offset: usize) -> u32;
    fn u64_at(&self, offset: usize) -> u64;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn i32_at(&self, offset: usize) -> i32 {
        self.u32_at(offset) as i32
    }
    /// Bytes `[offset, offset + len)` up to the first NUL.
    fn c_string_at(&self, offset: usize, len: usize) -> Vec<u8> {
        (offset..offset + len)
            .map(|at| self.byte_at(at))
            .take_while(|b| *b != 0)
            .collect()
    }
}

impl RegionBytes for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn byte_at(&self, offset: usize) -> u8 {
        self.get(offset).copied().unwrap_or(0)
    }
    fn u32_at(&self, offset: usize) -> u32 {
        self.get(offset..offset + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    }
    fn u64_at(&self, offset: usize) -> u64 {
        self.get(offset..offset + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    }
}

impl RegionBytes for Vec<u8> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn byte_at(&self, offset: usize) -> u8 {
        self.as_slice().byte_at(offset)
    }
    fn u32_at(&self, offset: usize) -> u32 {
        self.as_slice().u32_at(offset)
    }
    fn u64_at(&self, offset: usize) -> u64 {
        self.as_slice().u64_at(offset)
    }
}

/// A read-only, shared mapping of a region file. Every read is an atomic load, because the
/// writers (other processes) store concurrently; nothing here takes a lock or a semaphore
/// of the region, so a reader can never block on a writer (or on a dead one).
///
/// The file is kept open so that the OFD liveness probes of our own region use it.
#[derive(Debug)]
pub struct MappedRegion {
    ptr: NonNull<u8>,
    len: usize,
    file: File,
}

// SAFETY: the mapping is only read through atomic loads; the file is a plain fd.
unsafe impl Send for MappedRegion {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// Maps the first `len` bytes of `path` read-only. The caller has checked that the file
    /// is at least `len` bytes long; a file shorter than `len` is refused here too.
    pub fn open(path: &Path, len: usize) -> io::Result<MappedRegion> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        if size < len as u64 || len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} has {size} bytes, {len} needed", path.display()),
            ));
        }
        // SAFETY: maps `len` bytes (checked against the file size above) of a file we opened,
        // read-only and shared; the result is checked before use and unmapped in Drop.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(MappedRegion { ptr, len, file })
    }

    /// The open file behind the mapping.
    pub fn file(&self) -> &File {
        &self.file
    }

    fn in_bounds(&self, offset: usize, size: usize) -> bool {
        offset.checked_add(size).is_some_and(|end| end <= self.len)
    }
}

impl RegionBytes for MappedRegion {
    fn len(&self) -> usize {
        self.len
    }

    fn byte_at(&self, offset: usize) -> u8 {
        if !self.in_bounds(offset, 1) {
            return 0;
        }
        // SAFETY: in bounds of a live mapping; an AtomicU8 has no alignment requirement and
        // the bytes are only ever accessed atomically by this process.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset)) }.load(Relaxed)
    }

    fn u32_at(&self, offset: usize) -> u32 {
        if !self.in_bounds(offset, 4) {
            return 0;
        }
        if !offset.is_multiple_of(4) {
            return u32::from_le_bytes(std::array::from_fn(|i| self.byte_at(offset + i)));
        }
        // SAFETY: in bounds, 4-aligned (the mapping is page-aligned), read atomically.
        u32::from_le(
            unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) }.load(Relaxed),
        )
    }

    fn u64_at(&self, offset: usize) -> u64 {
        if !self.in_bounds(offset, 8) {
            return 0;
        }
        if !offset.is_multiple_of(8) {
            return u64::from_le_bytes(std::array::from_fn(|i| self.byte_at(offset + i)));
        }
        // SAFETY: in bounds, 8-aligned (the mapping is page-aligned), read atomically.
        u64::from_le(
            unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast()) }.load(Relaxed),
        )
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `open`, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_and_mapping_read_the_same_values() {
        let dir = std::env::temp_dir().join(format!("hami-monitor-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r");
        let mut bytes = vec![0u8; 64];
        bytes[0..4].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        bytes[17..21].copy_from_slice(&7u32.to_le_bytes());
        bytes[32..35].copy_from_slice(b"GPU");
        std::fs::write(&path, &bytes).unwrap();
        let map = MappedRegion::open(&path, 64).unwrap();
        for source in [&bytes as &dyn RegionBytes, &map] {
            assert_eq!(source.u32_at(0), 0x1234_5678);
            assert_eq!(source.u64_at(8), u64::MAX);
            assert_eq!(source.u32_at(17), 7, "unaligned");
            assert_eq!(source.c_string_at(32, 8), b"GPU");
            assert_eq!(source.u64_at(60), 0, "out of bounds reads 0");
        }
        assert!(
            MappedRegion::open(&path, 65).is_err(),
            "longer than the file"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
