//! Node Events about GPUs (SPEC §4), decided by comparing two registrations (pure).

use std::collections::BTreeSet;

use hami_amd_discovery::registration::RegisteredDevice;

/// A Node event to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuEvent {
    /// `AMDGPUUnhealthy`, `AMDGPUMissing`, `AMDGPURecovered`, `AMDGPUModeChangedInUse`.
    pub reason: &'static str,
    /// `Warning` or `Normal`.
    pub kind: &'static str,
    /// The event message, naming the GPU.
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
                            "GPU {} ({}) is unhealthy: /dev/dri/renderD{} cannot be opened, or the AMD device-metrics exporter reports it unhealthy",
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

#[cfg(test)]
mod tests {
    use super::*;
    use hami_amd_discovery::discovery::discover;
    use hami_amd_discovery::registration::{RegistrationSettings, register};

    /// The fixture's devices as the plugin registers them (every render node of a fixture
    /// tree is there, so each is healthy, as the plugin's `build_report` finds them).
    fn devices(tree: &hami_sysfs_fixtures::FixtureTree) -> Vec<RegisteredDevice> {
        let discovery = discover(&tree.sysfs_root()).unwrap();
        register(&discovery, &RegistrationSettings::default(), |_| true).devices
    }

    #[test]
    fn missing_recovered_unhealthy_and_mode_changed_in_use() {
        let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
        let before = devices(&tree);
        let none = BTreeSet::new();
        assert!(gpu_events(&before, &before, &none).is_empty());

        // A card vanishes: AMDGPUMissing naming it.
        let gone = before[2].clone();
        let after: Vec<_> = before
            .iter()
            .filter(|d| d.info.id != gone.info.id)
            .cloned()
            .collect();
        let events = gpu_events(&before, &after, &none);
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].reason, events[0].kind),
            ("AMDGPUMissing", "Warning")
        );
        assert!(
            events[0].message.contains(&gone.info.id) && events[0].message.contains(&gone.pci_bdf)
        );

        // Unhealthy, then healthy again: AMDGPUUnhealthy, then AMDGPURecovered.
        let mut sick = before.clone();
        sick[1].info.health = false;
        let events = gpu_events(&before, &sick, &none);
        assert_eq!(
            events.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["AMDGPUUnhealthy"]
        );
        let events = gpu_events(&sick, &before, &none);
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].reason, events[0].kind),
            ("AMDGPURecovered", "Normal")
        );
        assert!(events[0].message.contains(&before[1].info.id));

        // The compute partition changes under a card in use: one event for that card;
        // the same change on a card nobody uses is not an event.
        let mut changed = before.clone();
        for d in changed.iter_mut().take(2) {
            d.info.custom_info.compute_partition = Some("CPX".into());
        }
        let in_use: BTreeSet<String> = [before[0].info.id.clone()].into();
        let events = gpu_events(&before, &changed, &in_use);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].reason, "AMDGPUModeChangedInUse");
        assert!(events[0].message.contains(&before[0].pci_bdf));
        assert!(
            events[0].message.contains("none to CPX"),
            "{}",
            events[0].message
        );
    }
}
