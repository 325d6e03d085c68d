//! What a pod holds on its node, from its `*-devices-allocated` annotations (SPEC §3):
//! init containers run one after another, so they count at their peak; app containers and
//! sidecars run together, so they are summed; the pod holds the larger of the two.

use std::collections::BTreeMap;

use hami_protocol::device_list::ContainerDevices;
use hami_protocol::requests::ContainerKind;

/// What a pod holds on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCharge {
    /// Registered device id.
    pub uuid: String,
    /// Slots (shares) taken: the number of concurrently running containers on it.
    pub slots: u32,
    /// MiB held.
    pub mem_mib: u64,
    /// CUs for AMD, percent for NVIDIA.
    pub cores: u64,
}

#[derive(Default, Clone, Copy)]
struct Amount {
    slots: u32,
    mem: u64,
    cores: u64,
}

/// What one container was granted on one GPU: the pod's `container_index`-th device-list
/// run (init and sidecar containers first, then app containers, SPEC §2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerGrant {
    /// Index of the container's run in the device list.
    pub container_index: usize,
    /// Registered device id.
    pub uuid: String,
    /// MiB granted.
    pub mem_mib: u64,
    /// As written in the device list: AMD CUs, NVIDIA percent.
    pub cores: u32,
}

/// Every container's grants, in device-list order.
pub fn container_grants(runs: &[ContainerDevices]) -> Vec<ContainerGrant> {
    runs.iter()
        .enumerate()
        .flat_map(|(container_index, run)| {
            run.iter().map(move |dev| ContainerGrant {
                container_index,
                uuid: dev.uuid.clone(),
                mem_mib: dev.mem_mib,
                cores: dev.cores,
            })
        })
        .collect()
}

/// Collapses a pod's container runs into per-device charges.
///
/// `kinds[i]` is the kind of container `i` (device-list order). When the runs do not line
/// up with the containers (an unpadded list written by the reference scheduler), every run
/// is summed, which can only over-count.
pub fn collapse(kinds: &[ContainerKind], runs: &[ContainerDevices]) -> Vec<DeviceCharge> {
    let aligned = kinds.len() == runs.len();
    let mut init_peak: BTreeMap<&str, Amount> = BTreeMap::new();
    let mut concurrent: BTreeMap<&str, Amount> = BTreeMap::new();
    for (i, run) in runs.iter().enumerate() {
        let is_init = aligned && kinds[i] == ContainerKind::Init;
        for dev in run {
            if is_init {
                let a = init_peak.entry(&dev.uuid).or_default();
                a.slots = 1;
                a.mem = a.mem.max(dev.mem_mib);
                a.cores = a.cores.max(dev.cores.into());
            } else {
                let a = concurrent.entry(&dev.uuid).or_default();
                a.slots = a.slots.saturating_add(1);
                a.mem = a.mem.saturating_add(dev.mem_mib);
                a.cores = a.cores.saturating_add(dev.cores.into());
            }
        }
    }
    let mut out: BTreeMap<&str, Amount> = concurrent;
    for (uuid, peak) in init_peak {
        let a = out.entry(uuid).or_default();
        a.slots = a.slots.max(peak.slots);
        a.mem = a.mem.max(peak.mem);
        a.cores = a.cores.max(peak.cores);
    }
    out.into_iter()
        .map(|(uuid, a)| DeviceCharge {
            uuid: uuid.to_owned(),
            slots: a.slots,
            mem_mib: a.mem,
            cores: a.cores,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_protocol::device_list::{ContainerDevice, decode_pod_devices};

    fn dev(uuid: &str, mem: u64, cores: u32) -> ContainerDevice {
        ContainerDevice {
            uuid: uuid.into(),
            device_type: "AMD X".into(),
            mem_mib: mem,
            cores,
        }
    }

    #[test]
    fn init_peak_app_sum() {
        use ContainerKind::*;
        let kinds = [Init, Init, App, App];
        let runs = vec![
            vec![dev("A", 8000, 200)],
            vec![dev("A", 1000, 10), dev("B", 5, 5)],
            vec![dev("A", 2000, 50)],
            vec![dev("A", 3000, 60)],
        ];
        let charges = collapse(&kinds, &runs);
        assert_eq!(
            charges,
            vec![
                DeviceCharge {
                    uuid: "A".into(),
                    slots: 2,
                    mem_mib: 8000,
                    cores: 200
                },
                DeviceCharge {
                    uuid: "B".into(),
                    slots: 1,
                    mem_mib: 5,
                    cores: 5
                },
            ]
        );
    }

    #[test]
    fn sidecars_run_beside_apps() {
        use ContainerKind::*;
        let runs = decode_pod_devices("A,T,100,10:;A,T,100,10:;").unwrap();
        let charges = collapse(&[Sidecar, App], &runs);
        assert_eq!(
            charges[0],
            DeviceCharge {
                uuid: "A".into(),
                slots: 2,
                mem_mib: 200,
                cores: 20
            }
        );
    }

    #[test]
    fn unaligned_runs_are_summed() {
        use ContainerKind::*;
        let runs = decode_pod_devices("A,T,100,10:;A,T,100,10:;").unwrap();
        let charges = collapse(&[Init, App, App], &runs);
        assert_eq!(charges[0].mem_mib, 200);
        assert!(collapse(&[], &[]).is_empty());
    }
}
