//! dmem limits (kernel ≥ 6.14), decided as plain data.
//!
//! Where the limit goes: the **pod** cgroup. The runtime creates the pod cgroup before
//! any container (pause sandbox, init containers, app containers and their restarts all
//! live below it), so a limit written there holds for every container of the pod, cannot
//! be raced for by the pod's containers, and survives container restarts (a container's
//! own cgroup is created anew on each restart). The value per VRAM region is the pod's
//! peak: init containers run one at a time before the app containers, so
//! `max(largest init container, sum of app containers and sidecars)` — the same collapse
//! the scheduler uses to charge the pod. A device region is one card
//! (`drm/<pci bdf>/vram0`): partitions of one card share it, so their limits add up.

use std::collections::BTreeMap;

use hami_protocol::device_list::ContainerDevice;
use hami_protocol::node_register::DeviceMode;
use hami_protocol::requests::ContainerKind;

use hami_amd_discovery::registration::RegisteredDevice;

/// A dmem limit of one VRAM region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmemLimit {
    /// `drm/<pci bdf>/vram0`.
    pub region: String,
    /// The limit, in bytes.
    pub bytes: u64,
}

/// The dmem region of a device's card.
pub fn region_of(dev: &RegisteredDevice) -> String {
    format!("drm/{}/vram0", dev.pci_bdf)
}

/// Bytes one container may use on each region: its devices' limits summed per region
/// (a whole partition counts with its own memory).
fn per_region(
    run: &[ContainerDevice],
    devices: &[&RegisteredDevice],
) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (entry, dev) in run.iter().zip(devices) {
        let bytes = if dev.info.mode == DeviceMode::Xcp {
            dev.mem_bytes
        } else {
            (entry.mem_mib << 20).min(dev.mem_bytes)
        };
        let slot = out.entry(region_of(dev)).or_insert((0, card_bytes(dev)));
        slot.0 = slot.0.saturating_add(bytes);
    }
    out
}

/// The whole card's memory: a partition's share times the partitions reported, at least
/// the device's own memory (used only to leave regions that would not be limited alone).
fn card_bytes(dev: &RegisteredDevice) -> u64 {
    dev.card_mem_bytes.max(dev.mem_bytes)
}

/// One container's limits (for reporting; the writer applies the pod's).
pub fn container_dmem(run: &[ContainerDevice], devices: &[&RegisteredDevice]) -> Vec<DmemLimit> {
    per_region(run, devices)
        .into_iter()
        .filter(|(_, (bytes, card))| bytes < card)
        .map(|(region, (bytes, _))| DmemLimit { region, bytes })
        .collect()
}

/// The pod's limits from its whole decision (`*-devices-allocated`, one run per container
/// in device-list order) and the container kinds in the same order. A region is limited
/// only when the pod's peak on it is below the card's memory; runs naming a device this
/// node does not offer are skipped (Allocate refuses them anyway).
pub fn pod_dmem(
    runs: &[Vec<ContainerDevice>],
    kinds: &[ContainerKind],
    devices: &[RegisteredDevice],
) -> Vec<DmemLimit> {
    let aligned = runs.len() == kinds.len();
    let mut init_peak: BTreeMap<String, u64> = BTreeMap::new();
    let mut together: BTreeMap<String, u64> = BTreeMap::new();
    let mut card: BTreeMap<String, u64> = BTreeMap::new();
    for (i, run) in runs.iter().enumerate() {
        let resolved: Vec<&RegisteredDevice> = run
            .iter()
            .filter_map(|e| devices.iter().find(|d| d.info.id == e.uuid))
            .collect();
        if resolved.len() != run.len() {
            continue;
        }
        let is_init = aligned && kinds[i] == ContainerKind::Init;
        for (region, (bytes, card_total)) in per_region(run, &resolved) {
            card.insert(region.clone(), card_total);
            if is_init {
                let peak = init_peak.entry(region).or_default();
                *peak = (*peak).max(bytes);
            } else {
                let sum = together.entry(region).or_default();
                *sum = sum.saturating_add(bytes);
            }
        }
    }
    for (region, peak) in init_peak {
        let sum = together.entry(region).or_default();
        *sum = (*sum).max(peak);
    }
    together
        .into_iter()
        .filter(|(region, bytes)| card.get(region).is_some_and(|c| bytes < c))
        .map(|(region, bytes)| DmemLimit { region, bytes })
        .collect()
}
