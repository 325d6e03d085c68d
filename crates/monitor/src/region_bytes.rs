//! Byte access to a shared region: a plain slice (tests, golden files) or [`Segments`], the
//! ranges the monitor copied out of a region file with `pread`.
//!
//! The readers of the region layouts are written against [`RegionBytes`] so they stay pure:
//! a golden test hands them a `Vec<u8>`, the monitor a [`Segments`]. Reads out of
//! bounds return 0 (the readers check the length first; this is only a second guard).

/// Little-endian reads at byte offsets.
pub trait RegionBytes {
    /// Size in bytes.
    fn len(&self) -> usize;
    /// The byte at `offset` (0 out of bounds).
    fn byte_at(&self, offset: usize) -> u8;
    /// Little-endian `u32` at `offset` (0 out of bounds).
    fn u32_at(&self, offset: usize) -> u32;
    /// Little-endian `u64` at `offset` (0 out of bounds).
    fn u64_at(&self, offset: usize) -> u64;

    /// Whether there are no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Little-endian `i32` at `offset` (0 out of bounds).
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

/// Bytes of a region read from its file at a few ranges (header, live slots, tail); every
/// other offset reads as 0. `len` is the file's size as `fstat` reported it, so the readers'
/// size checks see the real file. Copying into a buffer instead of mapping means no file
/// content or size (a tenant truncating its file) can fault the monitor: a mapping read past
/// a truncation raises SIGBUS, a `pread` just returns fewer bytes.
#[derive(Debug, Clone, Default)]
pub struct Segments {
    len: usize,
    parts: Vec<(usize, Vec<u8>)>,
}

impl Segments {
    /// No ranges yet of a file of `len` bytes.
    pub fn new(len: usize) -> Segments {
        Segments {
            len,
            parts: Vec::new(),
        }
    }

    /// Adds the bytes found at `start` (ranges are few and do not overlap).
    pub fn push(&mut self, start: usize, bytes: Vec<u8>) {
        self.parts.push((start, bytes));
    }

    fn byte_at_checked(&self, offset: usize, i: usize) -> u8 {
        offset.checked_add(i).map_or(0, |at| self.byte_at(at))
    }

    fn slice(&self, offset: usize, size: usize) -> Option<&[u8]> {
        let end = offset.checked_add(size)?;
        self.parts.iter().find_map(|(start, bytes)| {
            (offset >= *start && end <= start + bytes.len())
                .then(|| &bytes[offset - start..end - start])
        })
    }
}

impl RegionBytes for Segments {
    fn len(&self) -> usize {
        self.len
    }
    fn byte_at(&self, offset: usize) -> u8 {
        self.slice(offset, 1).map_or(0, |b| b[0])
    }
    fn u32_at(&self, offset: usize) -> u32 {
        match self.slice(offset, 4) {
            Some(b) => b.u32_at(0),
            None => u32::from_le_bytes(std::array::from_fn(|i| self.byte_at_checked(offset, i))),
        }
    }
    fn u64_at(&self, offset: usize) -> u64 {
        match self.slice(offset, 8) {
            Some(b) => b.u64_at(0),
            None => u64::from_le_bytes(std::array::from_fn(|i| self.byte_at_checked(offset, i))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_read_like_the_slice_they_were_cut_from() {
        let mut bytes = vec![0u8; 64];
        bytes[0..4].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        bytes[17..21].copy_from_slice(&7u32.to_le_bytes());
        bytes[32..35].copy_from_slice(b"GPU");
        let mut segs = Segments::new(64);
        segs.push(0, bytes[0..20].to_vec());
        segs.push(20, bytes[20..40].to_vec());
        for source in [&bytes as &dyn RegionBytes, &segs] {
            assert_eq!(source.len(), 64);
            assert_eq!(source.u32_at(0), 0x1234_5678);
            assert_eq!(source.u64_at(8), u64::MAX);
            assert_eq!(source.u32_at(17), 7, "unaligned, across two parts");
            assert_eq!(source.c_string_at(32, 8), b"GPU");
            assert_eq!(source.u64_at(60), 0, "not read / out of bounds reads 0");
        }
        assert_eq!(segs.u64_at(usize::MAX - 2), 0, "no overflow");
    }
}
