//! Node Events about GPUs (SPEC §4), decided by comparing two registrations (pure).

use std::collections::BTreeSet;

use crate::registration::RegisteredDevice;

/// A Node event to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuEvent {
    /// `AMDGPUUnhealthy`, `AMDGPUMissing`, `AMDGPURecovered`, `AMDGPUModeChangedInUse`.
    pub reason: &'static str,
    /// `Warning` or `Normal`.
    pub kind: &'static str,
    pub message: String,
}

/// Events between the previous and the current device list. `in_use` holds the ids of
/// devices that have CUs allocated to live pods.
pub fn gpu_events(
    previous: &[RegisteredDevice],
    current: &[RegisteredDevice],
    in_use: &BTreeSet<String>,
) -> Vec<GpuEvent> {
    let mut events = Vec::new();
    for old in previous {
        match current.iter().find(|d| d.info.id == old.info.id) {
            None => events.push(GpuEvent {
                reason: "AMDGPUMissing",
                kind: "Warning",
                message: format!(
                    "GPU {} ({} card{}) is no longer found in sysfs",
                    old.info.id, old.pci_bdf, old.card
                ),
            }),
            Some(new) => {
                if old.info.health && !new.info.health {
                    events.push(GpuEvent {
                        reason: "AMDGPUUnhealthy",
                        kind: "Warning",
                        message: format!(
                            "GPU {} ({}): /dev/dri/renderD{} cannot be opened",
                            new.info.id, new.pci_bdf, new.render
                        ),
                    });
                } else if !old.info.health && new.info.health {
                    events.push(GpuEvent {
                        reason: "AMDGPURecovered",
                        kind: "Normal",
                        message: format!("GPU {} ({}) is healthy again", new.info.id, new.pci_bdf),
                    });
                }
            }
        }
    }
    // A card whose partition mode changed while slices of it run.
    let mut reported = BTreeSet::new();
    for new in current {
        let old_mode = previous
            .iter()
            .find(|d| d.pci_bdf == new.pci_bdf)
            .map(|d| d.info.custom_info.compute_partition.clone());
        if let Some(old_mode) = old_mode
            && old_mode != new.info.custom_info.compute_partition
            && previous
                .iter()
                .any(|d| d.pci_bdf == new.pci_bdf && in_use.contains(&d.info.id))
            && reported.insert(new.pci_bdf.clone())
        {
            events.push(GpuEvent {
                reason: "AMDGPUModeChangedInUse",
                kind: "Warning",
                message: format!(
                    "GPU {} changed compute partition from {} to {} while pods use it: their slices no longer match the hardware",
                    new.pci_bdf,
                    old_mode.as_deref().unwrap_or("none"),
                    new.info.custom_info.compute_partition.as_deref().unwrap_or("none")
                ),
            });
        }
    }
    events
}
