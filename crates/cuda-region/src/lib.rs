//! The HAMi-core shared region, version 1.2 (SPEC Appendix A), written byte-compatibly.
//!
//! - [`layout`]: the `repr(C)` structs, pinned to the Appendix A offsets at compile time.
//! - [`accounting`]: the pure writer operations over a mapped region (claim a stable slot,
//!   reserve before allocate, release, reclaim dead slots), run with the region lock held.
//! - [`region`]: the file shell: create or attach, map, lock, liveness by record locks.
//! - [`takeover`]: when a waiter may take the region lock word over (pure rule).

pub mod accounting;
pub mod layout;
pub mod region;
pub mod takeover;

pub use accounting::{Refusal, SlotError};
pub use layout::{MAGIC, MAX_DEVICES, MAX_PROCS, REGION_SIZE, SharedRegion};
pub use region::{InitValues, Region, RegionError, prepare_file};
