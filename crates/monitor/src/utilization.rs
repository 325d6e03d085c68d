//! Utilization per container × device (D-6, D-7), pure:
//! - NVIDIA: Σ `sm_util` of the live slots of a HAMi-core region, clamped to 100 (the raw
//!   sum can exceed 100 because per-process NVML samples overlap; HELP says so).
//! - AMD: busy time of the container's DRM clients between two samples ([`FdSampler`]),
//!   attributed to a registered device (partition) by the fd's DRM minor, checked against
//!   `drm-pdev` (`hami_amd_discovery::device_locator`), then to the container's grant.
//!
//! Publication is atomic by construction: a sampling pass builds a complete new map and the
//! shell swaps it in whole, so a scrape sees the previous complete values or the new ones,
//! never a zeroed or half-filled state; the first pass publishes nothing rather than zeros.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use hami_protocol::device_list::ContainerDevice;

use crate::fdinfo::{BusySample, DeviceUtilization, utilization};

/// Clamps a summed utilization to 0..=100 and says whether it was clamped.
pub fn clamp_sum(sum: u64) -> DeviceUtilization {
    DeviceUtilization {
        percent: sum.min(100) as f64,
        clamped: sum > 100,
    }
}

/// A container: (pod UID, container name).
pub type ContainerKey = (String, String);

/// Turns successive fdinfo samples into utilization.
#[derive(Debug, Default)]
pub struct FdSampler {
    previous: Option<(Instant, HashMap<ContainerKey, BusySample>)>,
}

impl FdSampler {
    /// Feeds the busy counters of every container seen now; returns utilization per
    /// container per `pdev` since the previous call, or `None` on the first call. A
    /// container seen only before (it stopped using the GPU, or exited) reads 0 once.
    pub fn advance(
        &mut self,
        now: Instant,
        current: HashMap<ContainerKey, BusySample>,
    ) -> Option<HashMap<ContainerKey, BTreeMap<String, DeviceUtilization>>> {
        let result = self.previous.as_ref().map(|(then, previous)| {
            let wall_ns = now.saturating_duration_since(*then).as_nanos() as u64;
            let keys: BTreeSet<&ContainerKey> = previous.keys().chain(current.keys()).collect();
            let empty = BusySample::new();
            keys.into_iter()
                .map(|key| {
                    let before = previous.get(key).unwrap_or(&empty);
                    let after = current.get(key).unwrap_or(&empty);
                    (key.clone(), utilization(before, after, wall_ns))
                })
                .collect()
        });
        self.previous = Some((now, current));
        result
    }
}

/// Utilization of one device by one AMD container.
#[derive(Debug, Clone, PartialEq)]
pub struct AmdDeviceUtil {
    /// Position of the device in the container's granted list; `None` when the container
    /// uses a GPU it was not granted through HAMi (e.g. a whole GPU from another plugin).
    pub vdevice_index: Option<usize>,
    /// Registered id of the device, or its PCI address when unknown.
    pub uuid: String,
    /// The utilization.
    pub util: DeviceUtilization,
}

/// Maps per-device utilization (keyed by registered id, or `drm-pdev` for a GPU that is not
/// registered) to the container's granted devices.
pub fn amd_container_devices(
    by_device: &BTreeMap<String, DeviceUtilization>,
    granted: &[ContainerDevice],
) -> Vec<AmdDeviceUtil> {
    by_device
        .iter()
        .map(|(uuid, util)| AmdDeviceUtil {
            vdevice_index: granted.iter().position(|d| d.uuid == *uuid),
            uuid: uuid.clone(),
            util: *util,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn sums_above_100_are_clamped() {
        assert_eq!(
            clamp_sum(42),
            DeviceUtilization {
                percent: 42.0,
                clamped: false
            }
        );
        assert_eq!(
            clamp_sum(100),
            DeviceUtilization {
                percent: 100.0,
                clamped: false
            }
        );
        assert_eq!(
            clamp_sum(250),
            DeviceUtilization {
                percent: 100.0,
                clamped: true
            }
        );
        assert_eq!(clamp_sum(u64::MAX).percent, 100.0);
    }

    fn key(c: &str) -> ContainerKey {
        ("uid".into(), c.into())
    }

    #[test]
    fn first_sample_publishes_nothing_then_deltas() {
        let mut sampler = FdSampler::default();
        let t0 = Instant::now();
        let sample = |ns: u64| -> HashMap<ContainerKey, BusySample> {
            [(key("a"), [(("0000:01:00.0".to_string(), 1), ns)].into())].into()
        };
        assert_eq!(
            sampler.advance(t0, sample(0)),
            None,
            "no zero-then-sample window"
        );
        let out = sampler
            .advance(t0 + Duration::from_secs(1), sample(300_000_000))
            .unwrap();
        assert!((out[&key("a")]["0000:01:00.0"].percent - 30.0).abs() < 1e-9);
        let out = sampler
            .advance(t0 + Duration::from_secs(2), HashMap::new())
            .unwrap();
        assert_eq!(
            out[&key("a")]["0000:01:00.0"].percent,
            0.0,
            "gone container reads 0 once"
        );
        let out = sampler
            .advance(t0 + Duration::from_secs(3), HashMap::new())
            .unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn devices_map_to_granted_positions() {
        let util = DeviceUtilization {
            percent: 10.0,
            clamped: false,
        };
        let by_device: BTreeMap<String, DeviceUtilization> = [
            ("u0".to_string(), util),
            ("u1".to_string(), util),
            ("0000:09:00.0".to_string(), util),
        ]
        .into();
        let granted = vec![ContainerDevice {
            uuid: "u1".into(),
            device_type: "AMD".into(),
            mem_mib: 1,
            cores: 1,
        }];
        let out = amd_container_devices(&by_device, &granted);
        assert_eq!(
            out[0].uuid, "0000:09:00.0",
            "unknown card keeps its PCI address"
        );
        assert_eq!(out[0].vdevice_index, None);
        assert_eq!(out[1].vdevice_index, None, "not granted");
        assert_eq!(
            (out[2].uuid.as_str(), out[2].vdevice_index),
            ("u1", Some(0))
        );
    }

    proptest! {
        #[test]
        fn clamp_is_bounded_and_exact_below_100(sum in any::<u64>()) {
            let u = clamp_sum(sum);
            prop_assert!(u.percent <= 100.0);
            prop_assert_eq!(u.clamped, sum > 100);
            if sum <= 100 { prop_assert_eq!(u.percent, sum as f64); }
        }
    }
}
