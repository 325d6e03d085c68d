//! The shared accounting region of the HIP memory hook (SPEC §5, §6): a versioned, memory-
//! mapped file shared by every process of a container and read by the monitor.
//!
//! - [`layout`]: the byte layout (documented byte by byte in README.md).
//! - [`accounting`]: the pure reserve/release/report decisions.
//! - [`Session`]: a process's claimed slot and the operations on the mapping.
//! - [`takeover`]: when a waiter may take a device lock word over (pure rule).

pub mod accounting;
pub mod layout;
pub mod plugin_file;
mod session;
pub mod takeover;

pub use accounting::OverLimit;
pub use session::{
    DeviceLock, DeviceUsage, Limits, Reclaimed, RegionError, ReserveError, Session, SlotView,
    attached_elsewhere, prepare_file,
};
