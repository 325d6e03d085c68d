//! The region file a plugin (the AMD device plugin's Allocate, the DRA driver's prepare)
//! makes in a container's or claim's cache directory, under the rule both regions share
//! (`hami_kernel_locks::region_file`): a region already there is kept, one no hook could
//! map is replaced unless a live process has it attached, a directory is refused.

use std::io;
use std::path::Path;

pub use hami_kernel_locks::region_file::RegionFile;

use crate::layout::REGION_SIZE;
use crate::{Limits, RegionError, prepare_file};

/// Applies the rule to the region file at `path`, removing one no hook could map and no
/// process has attached (the caller then makes a new one with [`prepare`]).
pub fn check(path: &Path) -> io::Result<RegionFile> {
    hami_kernel_locks::region_file::check(path, REGION_SIZE as u64)
}

/// The region at `path` with the plugin's `limits` (see [`prepare_file`]), or the usable
/// one an earlier try made; returns its inode for the hook config.
pub fn prepare(path: &Path, limits: &Limits) -> io::Result<u64> {
    hami_kernel_locks::region_file::prepare(path, REGION_SIZE as u64, || {
        prepare_file(path, limits).map_err(|e| match e {
            RegionError::Open { source, .. } if source.kind() == io::ErrorKind::AlreadyExists => {
                source
            }
            other => io::Error::other(format!(
                "cannot create the container's region file: {other}"
            )),
        })
    })
}

/// The limits a plugin writes into a new region: `memory_limit(device)` bytes where it
/// gives one (the hook config's limits), no limit elsewhere.
pub fn limits_of(memory_limit: impl Fn(u32) -> Option<u64>) -> Limits {
    let mut limits = Limits::default();
    for (device, slot) in limits.bytes.iter_mut().enumerate() {
        if let Some(bytes) = u32::try_from(device).ok().and_then(&memory_limit) {
            *slot = bytes;
        }
    }
    limits
}
