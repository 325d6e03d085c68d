//! A process's attachment to the region: the mapping, its claimed slot, and the accounting
//! operations. All shared state is touched through atomics of [`RegionLayout`].
//!
//! | module | concern |
//! |---|---|
//! | `file` | the region file: safe open, whole creation, mapping, whether it is held elsewhere |
//! | `attach` | attach (map, initialise or validate, claim a slot), drop, abandon |
//! | `books` | the device lock, reserve/release, usage, reclaiming dead processes' bytes |

mod attach;
mod books;
mod file;

pub use books::DeviceLock;
use file::*;
pub use file::{attached_elsewhere, prepare_file};

use std::fs::File;
use std::io;

use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::accounting::OverLimit;
use crate::layout::{LIMIT_NONE, MAJOR_VERSION, MAX_DEVICES, MAX_PROCS, RegionLayout};

/// Per-device limits a creator writes into a new region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes per device; [`LIMIT_NONE`] where no limit is configured.
    pub bytes: [u64; MAX_DEVICES],
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            bytes: [LIMIT_NONE; MAX_DEVICES],
        }
    }
}

impl Limits {
    fn configured_devices(&self) -> u32 {
        self.bytes.iter().filter(|b| **b != LIMIT_NONE).count() as u32
    }
}

/// Why the region could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The file cannot be opened or created.
    #[error(
        "cannot open the shared accounting file {path}: {source}; make sure its directory exists and is writable, or set HIP_DEVICE_MEMORY_SHARED_CACHE to a writable path"
    )]
    Open {
        /// The region file.
        path: PathBuf,
        /// What `open(2)` said.
        source: io::Error,
    },
    /// A system call on the file failed.
    #[error("cannot {what} the shared accounting file {path}: {source}")]
    Io {
        /// The operation that failed.
        what: &'static str,
        /// The region file.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// The file holds another layout version (or is not a region).
    #[error(
        "{path} is not a version {MAJOR_VERSION}.x HIP accounting region ({found}); delete it once no process uses it, or set HIP_DEVICE_MEMORY_SHARED_CACHE to another path"
    )]
    Incompatible {
        /// The region file.
        path: PathBuf,
        /// What its header holds instead.
        found: String,
    },
    /// Every process slot is held by a live process.
    #[error(
        "all {MAX_PROCS} process slots of {path} are held by live processes: no more processes can use the GPU in this container"
    )]
    Full {
        /// The region file.
        path: PathBuf,
    },
    /// The path is not a plain file this process may use: the directory is writable by the
    /// container, so a symbolic link, FIFO, directory or hard link there may be planted.
    #[error(
        "refusing the shared accounting file {path}: {reason}; it must be a regular file with one link that this hook created; remove it, or set HIP_DEVICE_MEMORY_SHARED_CACHE to another path"
    )]
    Unsafe {
        /// The region file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// The reservation would pass the device's limit.
    #[error(
        "device {device}: {} bytes requested, {} of {} bytes in use", .over.requested, .over.used, .over.limit
    )]
    OverLimit {
        /// The device index.
        device: usize,
        /// The figures that refused it.
        over: OverLimit,
    },
    /// The device index is outside the region.
    #[error("device index {0} is outside the region's {MAX_DEVICES} devices")]
    NoSuchDevice(usize),
}

/// Usage of one device as the region sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceUsage {
    /// Bytes reserved by all processes.
    pub used: u64,
    /// Limit in force in bytes (the stored one, capped by [`Session::cap_limits`]),
    /// [`LIMIT_NONE`](crate::layout::LIMIT_NONE) if none.
    pub limit: u64,
    /// Highest `used` seen since creation.
    pub peak: u64,
}

/// What a reclaim pass found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Slots of dead processes freed.
    pub slots: usize,
    /// Bytes those processes held, now returned to their devices.
    pub bytes: u64,
}

/// One slot as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    /// The slot's index in the region.
    pub index: usize,
    /// PID in the container's PID namespace.
    pub pid: i32,
    /// PID in the host namespace, 0 while unknown.
    pub hostpid: i32,
    /// Whether its owner lives (holds the slot's record lock; a failed probe counts as alive).
    pub alive: bool,
    /// `(device, bytes)` for devices where the slot holds bytes.
    pub used: Vec<(usize, u64)>,
}

/// A process's claimed slot in a mapped region. Dropping it returns the slot's bytes and
/// frees the slot; [`Session::abandon`] leaves both behind, as a SIGKILL does.
pub struct Session {
    map: NonNull<RegionLayout>,
    path: PathBuf,
    /// Holds the slot's record lock for the session's life.
    owner: File,
    /// A second open file description, holding nothing: liveness probes through it see
    /// every holder (including this session) and its `flock` serialises reclaims.
    probe: File,
    /// Threads of this process share `probe`'s `flock`, so they also need this.
    reclaim_mutex: Mutex<()>,
    slot: usize,
    word: u64,
    /// Per device, the highest limit this process accepts ([`Session::cap_limits`]); the
    /// region's stored limit is writable by every process of the container.
    ceiling: [u64; MAX_DEVICES],
}

// SAFETY: the mapping is only accessed through atomics; the files are plain fds.
unsafe impl Send for Session {}
// SAFETY: as above; every method takes `&self` and synchronises through atomics and locks.
unsafe impl Sync for Session {}
