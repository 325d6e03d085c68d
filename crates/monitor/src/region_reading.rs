//! A region file opened as its kind (HAMi-core's or ours, from its first bytes) and read
//! for one scrape: the byte ranges in use copied within the file's time budget, then
//! decoded with the liveness of its processes (`/proc` for HAMi-core's host pids, record
//! locks for ours). The gather's I/O; what the readings mean is `scrape::assemble`'s.

use std::fs::File;
use std::path::Path;

use crate::hami_core_region;
use crate::hip_region;
use crate::procfs::ProcRoot;
use crate::region_bytes::{RegionBytes, Segments};
use crate::region_file::{FileError, RegionFile};
use crate::scrape::RegionReading;

/// A region file kept open between scrapes, by kind.
#[derive(Debug)]
pub(crate) enum Region {
    /// HAMi-core's layout.
    Core(RegionFile),
    /// Our HIP layout.
    Hip(RegionFile),
}

/// Why a region file was not opened or read.
pub(crate) enum LoadError {
    Core(hami_core_region::CoreRegionError),
    Hip(hip_region::HipRegionError),
    File(FileError),
}

impl From<FileError> for LoadError {
    fn from(e: FileError) -> LoadError {
        LoadError::File(e)
    }
}

impl LoadError {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            LoadError::Core(e) => e.kind(),
            LoadError::Hip(e) => e.kind(),
            LoadError::File(e) => e.kind(),
        }
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Core(e) => e.fmt(f),
            LoadError::Hip(e) => e.fmt(f),
            LoadError::File(e) => e.fmt(f),
        }
    }
}

fn is_hip(head: &Segments) -> bool {
    head.u32_at(0) == hami_region::layout::MAGIC
}

/// Opens a region file and picks its kind from the first 12 bytes; the layout is checked
/// again on every read (the file may change under us).
pub(crate) fn load_region(path: &Path) -> Result<Region, LoadError> {
    let file = RegionFile::open(path)?;
    let region = {
        let mut read = file.reader(file.size()?);
        let head = read.read(0..hami_core_region::HEADER_LEN)?;
        if is_hip(head) {
            let probe = read.read(hip_region::fixed_range())?;
            hip_region::check_header(probe).map_err(LoadError::Hip)?;
            true
        } else {
            hami_core_region::detect_layout(head).map_err(LoadError::Core)?;
            false
        }
    };
    Ok(if region {
        Region::Hip(file)
    } else {
        Region::Core(file)
    })
}

/// Copies what a HAMi-core reading needs: header, tail, the `proc_num` slots in use.
pub(crate) fn read_core_bytes(file: &RegionFile) -> Result<Segments, LoadError> {
    let mut read = file.reader(file.size()?);
    // Header through the SM limits of the larger layout in one read (v1's end, past v0's).
    let head = read.read(0..hami_core_region::V1.procs)?;
    let layout = hami_core_region::detect_layout(head).map_err(LoadError::Core)?;
    let [fixed, tail] = hami_core_region::fixed_ranges(layout);
    debug_assert!(fixed.end <= hami_core_region::V1.procs);
    read.read(tail)?;
    let proc_num = read.read(0..0)?.i32_at(layout.proc_num);
    read.read(hami_core_region::slot_range(layout, proc_num))?;
    Ok(read.finish())
}

/// Copies what a HIP reading needs: header, device accounts, slots below the high water.
fn read_hip_bytes(file: &RegionFile) -> Result<Segments, LoadError> {
    let mut read = file.reader(file.size()?);
    let fixed = read.read(hip_region::fixed_range())?;
    hip_region::check_header(fixed).map_err(LoadError::Hip)?;
    let high = fixed.u32_at(hip_region::SLOT_HIGH_WATER);
    read.read(hip_region::slot_range(high))?;
    Ok(read.finish())
}

/// Whether another open file description holds a record lock on byte `offset` (hami-region's
/// liveness signal for a slot). A failing probe counts as alive: never hide usage on doubt.
fn record_locked(file: &File, offset: usize) -> bool {
    hami_kernel_locks::file_lock::record_locked_elsewhere(file, offset).unwrap_or(true)
}

/// Reads and decodes `region` for one scrape.
pub(crate) fn read(region: &Region, proc: &ProcRoot) -> Result<RegionReading, LoadError> {
    match region {
        Region::Core(file) => {
            let bytes = read_core_bytes(file)?;
            hami_core_region::read_region(&bytes, &|pid| proc.pid_alive(pid))
                .map(RegionReading::Core)
                .map_err(LoadError::Core)
        }
        Region::Hip(region_file) => {
            let bytes = read_hip_bytes(region_file)?;
            let file = region_file.file();
            let mut alive =
                |slot: usize| record_locked(file, hami_region::layout::slot_offset(slot));
            hip_region::read_region(&bytes, &mut alive)
                .map(RegionReading::Hip)
                .map_err(LoadError::Hip)
        }
    }
}
