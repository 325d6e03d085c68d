//! Which registered device a DRM client belongs to (for utilization and any other per-fd
//! reading, e.g. the monitor's DRM fdinfo).
//!
//! fdinfo's `drm-pdev` names the PCI function, and every hard partition of a card runs on
//! that one function: all partitions of a CPX card report the same `drm-pdev`. Crediting
//! by `drm-pdev` alone therefore lands everything on partition 0. The DRM minor the fd is
//! open on (`/proc/<pid>/fd/<n>` → `/dev/dri/renderD<m>` or `card<n>`) is per partition,
//! so it decides; `drm-pdev` alone decides only for an unpartitioned card.

use crate::registration::RegisteredDevice;

/// What is known about one DRM client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrmClient<'a> {
    /// fdinfo `drm-pdev`, e.g. `0000:05:00.0`.
    pub pdev: Option<&'a str>,
    /// Minor of the DRM node the fd is open on: `renderD<m>` (128..) or `card<n>` (0..).
    pub minor: Option<u32>,
}

/// Why a client could not be mapped to one device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocateError {
    /// No device carries the client's DRM minor.
    #[error("no registered device has DRM minor {0}")]
    UnknownMinor(u32),
    /// The minor and the drm-pdev the client names point at different cards.
    #[error("DRM minor {minor} belongs to {found}, not to drm-pdev {pdev}")]
    PdevMismatch {
        /// The client's DRM minor.
        minor: u32,
        /// The drm-pdev (PCI address) the client names.
        pdev: String,
        /// The card that minor belongs to.
        found: String,
    },
    /// No device is on the client's drm-pdev.
    #[error("no registered device is on drm-pdev {0}")]
    UnknownPdev(String),
    #[error(
        "drm-pdev {pdev} is a partitioned card ({partitions} partitions): the fd's DRM minor is needed to tell which"
    )]
    /// The pdev alone does not pick one partition of a partitioned card.
    Ambiguous {
        /// The drm-pdev the client names.
        pdev: String,
        /// How many partitions that card has.
        partitions: usize,
    },
    /// The client gave nothing to locate a device by.
    #[error("the client names neither a drm-pdev nor a DRM minor")]
    Nothing,
}

/// The device a client uses: by DRM minor (render or card node) when known, checked
/// against `drm-pdev`; else by `drm-pdev` when that card has exactly one device.
pub fn locate<'d>(
    devices: &'d [RegisteredDevice],
    client: DrmClient<'_>,
) -> Result<&'d RegisteredDevice, LocateError> {
    if let Some(minor) = client.minor {
        let dev = devices
            .iter()
            .find(|d| d.render == minor || d.card == minor)
            .ok_or(LocateError::UnknownMinor(minor))?;
        if let Some(pdev) = client.pdev
            && !pdev.eq_ignore_ascii_case(&dev.pci_bdf)
        {
            return Err(LocateError::PdevMismatch {
                minor,
                pdev: pdev.to_owned(),
                found: dev.pci_bdf.clone(),
            });
        }
        return Ok(dev);
    }
    let pdev = client.pdev.ok_or(LocateError::Nothing)?;
    let mut on_card = devices
        .iter()
        .filter(|d| d.pci_bdf.eq_ignore_ascii_case(pdev));
    match (on_card.next(), on_card.count()) {
        (None, _) => Err(LocateError::UnknownPdev(pdev.to_owned())),
        (Some(dev), 0) => Ok(dev),
        (Some(_), more) => Err(LocateError::Ambiguous {
            pdev: pdev.to_owned(),
            partitions: more + 1,
        }),
    }
}

/// The DRM minor of a device path as `/proc/<pid>/fd/<n>` links show it
/// (`/dev/dri/renderD129`, `/dev/dri/card3`); `None` for anything else.
pub fn drm_minor_of_path(path: &str) -> Option<u32> {
    let name = path.strip_prefix("/dev/dri/")?;
    name.strip_prefix("renderD")
        .or_else(|| name.strip_prefix("card"))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
}
